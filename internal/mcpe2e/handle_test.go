package mcpe2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/e2e"
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

// handleEnv runs three sessionless (2026-07-28) Go SDK replicas with the handle tools behind
// an mcp-streamable service with handle affinity and 2 session slots per instance.
func handleEnv(t *testing.T, kind e2e.Kind, h registry.MCPHandle) (*env, []*mcpreplica.Server) {
	t.Helper()
	reps := startGoReplicas(t, mcpreplica.Options{Stateless: true, Handles: true}, "ha", "hb", "hc")
	svc := mcpService("mcp", registry.AffinityMCPStreamable, 2)
	svc.MCPHandle = h
	e := newEnv(t, kind, []registry.Service{svc}, instancesOf("mcp", goReplicas(reps)...))
	logReplicasOnFailure(t, reps)
	return e, reps
}

// TestHandleAffinity: Go SDK clients on MCP 2026-07-28 (no protocol sessions) open handles
// through tether and use them; the client mirrors the handle into Mcp-Param-Handle, as the
// "use" tool's x-mcp-header asks. Six opens fill the 2 session slots of each of 3 replicas and
// a seventh is refused (503, no capacity) — each handle is used right after it is opened, as
// a prefix handle takes its slot at its first use; every use of a handle lands on the replica that
// minted it (the tool fails anywhere else), tether bound each handle to that replica, and calls
// without a handle are balanced freely over the replicas. Both ways of learning a handle's
// instance — the replica's Mcp-Handle response header, and the instance prefix of the handle
// — are run.
func TestHandleAffinity(t *testing.T) { e2e.ForEachKind(t, testHandleAffinity) }

func testHandleAffinity(t *testing.T, kind e2e.Kind) {
	for _, v := range handleVariants {
		t.Run(v.name, func(t *testing.T) {
			e, reps := handleEnv(t, kind, v.handle)
			ctx := testContext(t, 60*time.Second)
			cs, err := newGoClient("handles").Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.URL + "/mcp"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			closeAtEnd(t, cs)
			if v := cs.InitializeResult().ProtocolVersion; v < "2026-07-28" {
				t.Fatalf("negotiated %s, want a sessionless revision", v)
			}
			if _, err := cs.ListTools(ctx, nil); err != nil { // the client learns use's x-mcp-header
				t.Fatal(err)
			}
			// Each handle is used right after it is opened: a prefix handle takes its session
			// slot at its first use (a learned one already with the open's response).
			var handles []mcpreplica.Handle
			for i := range 6 {
				h, err := openHandle(ctx, cs)
				if err != nil {
					t.Fatalf("open %d: %v", i, err)
				}
				if _, err := useHandle(ctx, cs, h.Handle); err != nil {
					t.Fatalf("first use of %s: %v", h.Handle, err)
				}
				handles = append(handles, h)
			}
			if _, err := openHandle(ctx, cs); err == nil || !strings.Contains(err.Error(), "Service Unavailable") {
				t.Errorf("a 7th handle with 2 session slots on 3 replicas: %v, want a 503 refusal", err)
			}
			perReplica := map[string]int{}
			for _, h := range handles {
				perReplica[h.Instance]++
				for j := range 5 {
					who, err := useHandle(ctx, cs, h.Handle)
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
			// Calls without a handle are balanced freely.
			served := map[string]bool{}
			for range 9 {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
				if err != nil {
					t.Fatal(err)
				}
				who, err := decodeResult(res.StructuredContent)
				if err != nil {
					t.Fatal(err)
				}
				served[who.Instance] = true
			}
			if len(served) < 2 {
				t.Errorf("handle-less calls served by %v, want them spread", served)
			}
			e.waitRequestsFree("mcp")
		})
	}
}

// TestHandleUnknownOrForged: a handle tether never bound is refused 404 HandleNotFound (the
// signal to mint another) with learned handles; with prefix handles a handle naming no live
// instance is refused the same way, before reaching any replica.
func TestHandleUnknownOrForged(t *testing.T) { e2e.ForEachKind(t, testHandleUnknownOrForged) }

func testHandleUnknownOrForged(t *testing.T, kind e2e.Kind) {
	for _, v := range handleVariants {
		t.Run(v.name, func(t *testing.T) {
			e, reps := handleEnv(t, kind, v.handle)
			ctx := testContext(t, 30*time.Second)
			cs, err := newGoClient("forger").Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.URL + "/mcp"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			closeAtEnd(t, cs)
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatal(err)
			}
			before := 0
			for _, r := range reps {
				before += int(r.Requests())
			}
			for _, h := range []string{"nosuch:abc", "zz-no-prefix"} {
				if _, err := useHandle(ctx, cs, h); err == nil || !strings.Contains(err.Error(), "Not Found") {
					t.Errorf("use of forged handle %q: %v, want 404", h, err)
				}
			}
			after := 0
			for _, r := range reps {
				after += int(r.Requests())
			}
			if after != before {
				t.Errorf("forged handles reached replicas (%d requests)", after-before)
			}
		})
	}
}

func openHandle(ctx context.Context, cs *mcp.ClientSession) (mcpreplica.Handle, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "open"})
	if err != nil {
		return mcpreplica.Handle{}, err
	}
	var h mcpreplica.Handle
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &h); err != nil || h.Handle == "" {
		return h, fmt.Errorf("open result %s: %w", b, err)
	}
	return h, nil
}

func useHandle(ctx context.Context, cs *mcp.ClientSession, handle string) (mcpreplica.WhoAmI, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "use", Arguments: map[string]any{"handle": handle}})
	if err != nil {
		return mcpreplica.WhoAmI{}, err
	}
	if res.IsError {
		return mcpreplica.WhoAmI{}, fmt.Errorf("use failed: %+v", res.Content)
	}
	return decodeResult(res.StructuredContent)
}

// waitRequestsFree waits until no request slot of service is in use.
func (e *env) waitRequestsFree(service string) {
	e.t.Helper()
	testutil.Eventually(e.t, "request slots free", func() bool {
		_, r := e.totals(service)
		return r == 0
	})
}
