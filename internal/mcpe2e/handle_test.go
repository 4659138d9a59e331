package mcpe2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/mcpts"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// handleVariants are the two ways tether learns which instance a handle belongs to.
var handleVariants = []struct {
	name   string
	handle registry.MCPHandle
}{
	{"learned from the response header", registry.MCPHandle{Header: mcpreplica.HandleParam,
		LearnHeader: mcpreplica.HandleHeader, MintTools: []string{"open"}}},
	{"instance prefix", registry.MCPHandle{Header: mcpreplica.HandleParam, InstancePrefix: true, PrefixSeparator: ":",
		MintTools: []string{"open"}}},
}

// handleReplica is a running replica with the handle tools: "open" mints "<name>:<random>"
// and names it in the Mcp-Handle response header, "use" takes it in an x-mcp-header "Handle"
// argument and fails on a handle the replica did not mint.
type handleReplica struct {
	replica
	// log returns the requests the replica has received so far.
	log func(ctx context.Context) ([]mcpts.Request, error)
}

// handleServers are the replica implementations the handle tests run: the Go SDK
// (mcpreplica.Options{Stateless, Handles}) and the TS SDK 2.x server (handle-server.mjs).
var handleServers = []struct {
	name  string
	start func(t *testing.T, names ...string) []handleReplica
}{
	{"go replicas", startGoHandleReplicas},
	{"ts replicas", startTSHandleReplicas},
}

func startGoHandleReplicas(t *testing.T, names ...string) []handleReplica {
	t.Helper()
	reps := startGoReplicas(t, mcpreplica.Options{Stateless: true, Handles: true}, names...)
	logReplicasOnFailure(t, reps)
	out := make([]handleReplica, len(reps))
	for i, r := range reps {
		out[i] = handleReplica{replica: goReplica(r), log: func(context.Context) ([]mcpts.Request, error) {
			var log []mcpts.Request
			for _, x := range r.Log() {
				log = append(log, mcpts.Request{Method: x.Method, MCPMethod: x.MCPMethod, MCPName: x.MCPName, Handle: x.Handle})
			}
			return log, nil
		}}
	}
	return out
}

func startTSHandleReplicas(t *testing.T, names ...string) []handleReplica {
	t.Helper()
	skipUnlessTS(t)
	out := make([]handleReplica, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() {
			s, err := mcpts.StartHandleServer(context.Background(), n)
			if err != nil {
				errs[i] = err
				return
			}
			t.Cleanup(s.Close)
			out[i] = handleReplica{replica: tsReplica(s), log: s.Log}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, r := range out {
			log, err := r.log(context.Background())
			t.Logf("replica %s: %+v %v", r.Name, log, err)
		}
	})
	return out
}

// handleEnv runs tether in front of reps, three sessionless (2026-07-28) replicas with the
// handle tools, as an mcp-streamable service with handle affinity h and 2 session slots per
// instance.
func handleEnv(t *testing.T, kind e2e.Kind, h registry.MCPHandle, reps []handleReplica) *env {
	t.Helper()
	svc := mcpService("mcp", registry.AffinityMCPStreamable, 2)
	svc.MCPHandle = h
	rs := make([]replica, len(reps))
	for i, r := range reps {
		rs[i] = r.replica
	}
	return newEnv(t, kind, []registry.Service{svc}, instancesOf("mcp", rs...))
}

// handleClient is an MCP client on the sessionless era (2026-07-28) that has listed the tools,
// so it mirrors "use"'s x-mcp-header handle argument into Mcp-Param-Handle.
type handleClient interface {
	// call calls tool and returns its structured result; a tool error is an error.
	call(ctx context.Context, tool string, args map[string]any) (json.RawMessage, error)
	// refused reports whether err is tether's refusal with HTTP status.
	refused(err error, status int) bool
}

// handleClients are the clients the handle tests run: the Go SDK, and the TS SDK 2.x client
// pinned to 2026-07-28 (its default negotiation mode initializes a 2025-era session, which
// mirrors no x-mcp-header argument).
var handleClients = []struct {
	name    string
	connect func(t *testing.T, ctx context.Context, url string) handleClient
}{
	{"go sdk", connectGoHandles},
	{"ts client 2.x", connectTSHandles},
}

type goHandles struct{ cs *mcp.ClientSession }

func connectGoHandles(t *testing.T, ctx context.Context, url string) handleClient {
	t.Helper()
	cs, err := newGoClient("handles").Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, cs)
	if v := cs.InitializeResult().ProtocolVersion; v < v20260728 {
		t.Fatalf("negotiated %s, want a sessionless revision", v)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil { // the client learns use's x-mcp-header
		t.Fatal(err)
	}
	return goHandles{cs}
}

func (g goHandles) call(ctx context.Context, tool string, args map[string]any) (json.RawMessage, error) {
	params := &mcp.CallToolParams{Name: tool}
	if args != nil { // a nil map would be sent as "arguments": null, which the TS server rejects
		params.Arguments = args
	}
	res, err := g.cs.CallTool(ctx, params)
	if err != nil {
		return nil, err
	}
	if res.IsError {
		return nil, fmt.Errorf("tool %s failed: %+v", tool, res.Content)
	}
	return json.Marshal(res.StructuredContent)
}

// refused: the Go SDK reports a non-2xx answer as an error naming its status text.
func (goHandles) refused(err error, status int) bool {
	return err != nil && strings.Contains(err.Error(), http.StatusText(status))
}

type tsHandles struct{ s *mcpts.Session }

func connectTSHandles(t *testing.T, ctx context.Context, url string) handleClient {
	t.Helper()
	skipUnlessTS(t)
	s, err := mcpts.Connect(ctx, mcpts.SessionConfig{URL: url, SDK: mcpts.SDKv2, Pin: v20260728})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if s.Era != "modern" || s.ProtocolVersion < v20260728 {
		t.Fatalf("negotiated %s (%s era), want a sessionless revision", s.ProtocolVersion, s.Era)
	}
	if _, err := s.ListTools(ctx); err != nil { // the client learns use's x-mcp-header
		t.Fatal(err)
	}
	return tsHandles{s}
}

func (c tsHandles) call(ctx context.Context, tool string, args map[string]any) (json.RawMessage, error) {
	res, err := c.s.CallTool(ctx, tool, args)
	if err != nil {
		return nil, err
	}
	if res.IsError {
		return nil, fmt.Errorf("tool %s failed: %+v", tool, res.Content)
	}
	return res.StructuredContent, nil
}

func (tsHandles) refused(err error, status int) bool { return mcpts.StatusOf(err) == status }

// TestHandleAffinity: Go SDK and TS SDK 2.x clients on MCP 2026-07-28 (no protocol sessions),
// against Go SDK and TS SDK 2.x replicas, open handles through tether and use them; the client mirrors the handle into
// Mcp-Param-Handle, as the "use" tool's x-mcp-header asks. Six opens fill the 2 session slots
// of each of 3 replicas and a seventh is refused (503, no capacity) — each handle is used right
// after it is opened, as a prefix handle takes its slot at its first use; every use of a handle
// lands on the replica that minted it (counted at the replicas, which see the mirrored header;
// the tool also fails anywhere else), tether bound each handle to that replica, and calls
// without a handle are balanced freely over the replicas. Both ways of learning a handle's
// instance — the replica's Mcp-Handle response header, and the instance prefix of the handle
// — are run.
func TestHandleAffinity(t *testing.T) { e2e.ForEachKind(t, testHandleAffinity) }

func testHandleAffinity(t *testing.T, kind e2e.Kind) {
	for _, srv := range handleServers {
		// One set of replicas for the variants and clients, each with its own tether: handles
		// are unique, and each run counts only the requests the replicas get during it.
		reps := srv.start(t, "ha", "hb", "hc")
		for _, v := range handleVariants {
			for _, c := range handleClients {
				t.Run(v.name+"/"+srv.name+"/"+c.name, func(t *testing.T) {
					e := handleEnv(t, kind, v.handle, reps)
					ctx := testContext(t, 60*time.Second)
					checkHandleAffinity(t, ctx, e, reps, c.connect(t, ctx, e.URL+"/mcp"))
				})
			}
		}
	}
}

// usesPerHandle is how many times checkHandleAffinity uses each handle.
const usesPerHandle = 6

func checkHandleAffinity(t *testing.T, ctx context.Context, e *env, reps []handleReplica, c handleClient) {
	t.Helper()
	logs := func() [][]mcpts.Request {
		out := make([][]mcpts.Request, len(reps))
		for i, r := range reps {
			log, err := r.log(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = log
		}
		return out
	}
	before := logs()
	// Each handle is used right after it is opened: a prefix handle takes its session slot at
	// its first use (a learned one already with the open's response).
	var handles []mcpreplica.Handle
	for i := range 6 {
		h, err := openHandle(ctx, c)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		if _, err := useHandle(ctx, c, h.Handle); err != nil {
			t.Fatalf("first use of %s: %v", h.Handle, err)
		}
		handles = append(handles, h)
	}
	if _, err := openHandle(ctx, c); !c.refused(err, http.StatusServiceUnavailable) {
		t.Errorf("a 7th handle with 2 session slots on 3 replicas: %v, want a 503 refusal", err)
	}
	for id, u := range e.usage("mcp") {
		if u[0] != 2 {
			t.Errorf("instance %s holds %d session slots, want its 2 (usage %v)", id, u[0], e.usage("mcp"))
		}
	}
	perReplica := map[string]int{}
	for _, h := range handles {
		perReplica[h.Instance]++
		for j := range usesPerHandle - 1 {
			who, err := useHandle(ctx, c, h.Handle)
			if err != nil {
				t.Fatalf("use %s (%d): %v", h.Handle, j, err)
			}
			if who.Instance != h.Instance || who.Session != h.Handle {
				t.Fatalf("use of %s minted by %s served by %s (%+v)", h.Handle, h.Instance, who.Instance, who)
			}
		}
		s, err := e.session("mcp", h.Handle)
		if err != nil || s.Instance != h.Instance || s.Kind != session.KindMCPHandle || s.Status != session.StatusActive {
			t.Errorf("tether's binding of %s: %+v, %v; want Active mcp-handle on %s", h.Handle, s, err, h.Instance)
		}
	}
	for _, r := range reps {
		if perReplica[r.Name] != 2 {
			t.Errorf("handles per replica %v, want 2 on each", perReplica)
		}
	}
	// Counted at the replicas: every use carried its handle in Mcp-Param-Handle and reached the
	// replica that minted it, and no other.
	for i, log := range logs() {
		r := reps[i]
		got := map[string]int{}
		for _, rec := range log[len(before[i]):] {
			if rec.MCPName == "use" {
				got[rec.Handle]++
			}
		}
		want := map[string]int{}
		for _, h := range handles {
			if h.Instance == r.Name {
				want[h.Handle] = usesPerHandle
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("uses per handle at replica %s (-want +got; \"\" = no Mcp-Param-Handle):\n%s", r.Name, diff)
		}
	}
	// Calls without a handle are balanced freely.
	served := map[string]bool{}
	for range 9 {
		raw, err := c.call(ctx, "whoami", nil)
		if err != nil {
			t.Fatal(err)
		}
		var who mcpreplica.WhoAmI
		if err := json.Unmarshal(raw, &who); err != nil {
			t.Fatal(err)
		}
		served[who.Instance] = true
	}
	if len(served) < 2 {
		t.Errorf("handle-less calls served by %v, want them spread", served)
	}
	e.waitRequestsFree("mcp")
}

// TestHandleUnknownOrForged: a handle tether never bound is refused 404 HandleNotFound (the
// signal to mint another) with learned handles; with prefix handles a handle naming no live
// instance — or naming a live one ("ha:…") without a mint there (#25 finding 3: the landed
// build bound it, a full session on ha) — is refused the same way, before reaching any replica. Go SDK and TS SDK 2.x clients,
// Go replicas (the refusal reaches no replica, so their SDK does not matter).
func TestHandleUnknownOrForged(t *testing.T) { e2e.ForEachKind(t, testHandleUnknownOrForged) }

func testHandleUnknownOrForged(t *testing.T, kind e2e.Kind) {
	for _, v := range handleVariants {
		for _, c := range handleClients {
			t.Run(v.name+"/"+c.name, func(t *testing.T) {
				reps := startGoHandleReplicas(t, "ha", "hb", "hc")
				e := handleEnv(t, kind, v.handle, reps)
				ctx := testContext(t, 30*time.Second)
				cl := c.connect(t, ctx, e.URL+"/mcp")
				requests := func() int {
					n := 0
					for _, r := range reps {
						log, err := r.log(ctx)
						if err != nil {
							t.Fatal(err)
						}
						n += len(log)
					}
					return n
				}
				before := requests()
				for _, h := range []string{"nosuch:abc", "zz-no-prefix", "ha:forged", "hb:forged-too"} {
					if _, err := useHandle(ctx, cl, h); !cl.refused(err, http.StatusNotFound) {
						t.Errorf("use of forged handle %q: %v, want 404", h, err)
					}
				}
				if after := requests(); after != before {
					t.Errorf("forged handles reached replicas (%d requests)", after-before)
				}
				if s, _ := e.totals("mcp"); s != 0 {
					t.Errorf("forged handles hold %d session slots, want 0", s)
				}
			})
		}
	}
}

func openHandle(ctx context.Context, c handleClient) (mcpreplica.Handle, error) {
	raw, err := c.call(ctx, "open", nil)
	if err != nil {
		return mcpreplica.Handle{}, err
	}
	var h mcpreplica.Handle
	if err := json.Unmarshal(raw, &h); err != nil || h.Handle == "" {
		return h, fmt.Errorf("open result %s: %w", raw, err)
	}
	return h, nil
}

func useHandle(ctx context.Context, c handleClient, handle string) (mcpreplica.WhoAmI, error) {
	raw, err := c.call(ctx, "use", map[string]any{"handle": handle})
	if err != nil {
		return mcpreplica.WhoAmI{}, err
	}
	var who mcpreplica.WhoAmI
	if err := json.Unmarshal(raw, &who); err != nil {
		return who, fmt.Errorf("use result %s: %w", raw, err)
	}
	return who, nil
}

// waitRequestsFree waits until no request slot of service is in use.
func (e *env) waitRequestsFree(service string) {
	e.t.Helper()
	testutil.Eventually(e.t, "request slots free", func() bool {
		_, r := e.totals(service)
		return r == 0
	})
}
