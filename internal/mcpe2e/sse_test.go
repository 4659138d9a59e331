package mcpe2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
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

// sseFlavour is one implementation of HTTP+SSE (2024-11-05) replicas.
type sseFlavour struct {
	name string
	// param is the endpoint's session query parameter, configured as sse.sessionParam.
	param string
	// postPath is where the endpoint event sends the client's POSTs.
	postPath string
	// sessionInResult: the whoami tool reports the HTTP+SSE session id (TS SDK; the Go SDK's
	// ServerSession.ID() is empty on SSE).
	sessionInResult bool
	// requests returns how many HTTP requests each replica received, or nil when unknown.
	requests func() map[string]int64
}

var sseFlavours = []sseFlavour{
	{name: "go-sdk sessionid", param: "sessionid", postPath: "/sse"},
	{name: "ts-sdk sessionId", param: "sessionId", postPath: "/messages", sessionInResult: true},
}

// startSSEReplicas starts three replicas of the flavour.
func (f *sseFlavour) startReplicas(t *testing.T, ids ...string) []replica {
	t.Helper()
	if f.param == "sessionId" {
		skipUnlessTS(t)
		out := make([]replica, len(ids))
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		for i, n := range ids {
			wg.Go(func() {
				s, err := mcpts.StartSSEServer(context.Background(), n)
				if err != nil {
					errs[i] = err
					return
				}
				t.Cleanup(s.Close)
				out[i] = tsReplica(s)
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		f.requests = nil
		return out
	}
	reps := startGoReplicas(t, mcpreplica.Options{}, ids...)
	f.requests = func() map[string]int64 {
		m := map[string]int64{}
		for _, r := range reps {
			m[r.Name] = r.Requests()
		}
		return m
	}
	return goReplicas(reps)
}

// service returns the mcp-sse service "legacy" (SSE path /sse) for the flavour's replicas.
func (f *sseFlavour) service(sessionsPerInstance int) registry.Service {
	svc := mcpService("legacy", registry.AffinityMCPSSE, sessionsPerInstance)
	svc.SSE = registry.SSE{Path: "/sse", SessionParam: f.param}
	return svc
}

// resultSession is the session a tool result of the flavour's replicas must name: sid when
// they report it, "" (not checked) otherwise.
func (f *sseFlavour) resultSession(sid string) string {
	if f.sessionInResult {
		return sid
	}
	return ""
}

// sseEnv runs the flavour's replicas named ids behind its service "legacy".
func sseEnv(t *testing.T, kind e2e.Kind, f *sseFlavour, sessionsPerInstance int, ids ...string) (*env, []replica) {
	t.Helper()
	reps := f.startReplicas(t, ids...)
	return newEnv(t, kind, []registry.Service{f.service(sessionsPerInstance)}, instancesOf("legacy", reps...)), reps
}

// TestSSEGoClientsPinned runs 6 Go SDK HTTP+SSE clients at once over 3 replicas with 2
// session slots each, for Go-style (/sse?sessionid=) and TS-style (/messages?sessionId=)
// replicas. tether learns each session from the first endpoint event of its GET; every POST
// (the roots/list reply included) reaches the GET's replica; each open GET holds one request
// slot and one session slot until the client closes it.
func TestSSEGoClientsPinned(t *testing.T) { e2e.ForEachKind(t, testSSEGoClientsPinned) }

func testSSEGoClientsPinned(t *testing.T, kind e2e.Kind) {
	for _, f := range sseFlavours {
		t.Run(f.name, func(t *testing.T) {
			e, reps := sseEnv(t, kind, &f, 2, "ga", "gb", "gc")
			ctx := testContext(t, 45*time.Second)

			clients := runGoClients(ctx, t, 6, func(ctx context.Context, i int, hc *http.Client) (*mcp.ClientSession, error) {
				return connectSSE(ctx, fmt.Sprintf("sse-%d", i), e.URL+"/sse", hc)
			}, "whoami", "roots", "whoami")
			for _, c := range clients {
				if c.cs != nil {
					closeAtEnd(t, c.cs)
				}
			}

			sids := map[string]string{}
			for i, c := range clients {
				if c.err != nil {
					t.Fatalf("client %d: %v", i, c.err)
				}
				sid, inst := checkSSEExchanges(t, fmt.Sprintf("client %d", i), c.rec.exchanges(), f)
				sids[sid] = inst
				checkServed(t, fmt.Sprintf("client %d", i), c.results, inst, f.resultSession(sid))
				if r := c.results[1]; r.Roots != clientRoots {
					t.Errorf("client %d: roots = %d, want %d", i, r.Roots, clientRoots)
				}
				s, err := e.session("legacy", sid)
				if err != nil || s.Instance != inst || s.Status != session.StatusActive || s.Kind != session.KindMCPSSE {
					t.Errorf("client %d: binding of %s = %+v, %v; want Active mcp-sse on %q", i, sid, s, err, inst)
				}
			}
			if len(sids) != len(clients) {
				t.Fatalf("%d distinct SSE sessions for %d clients", len(sids), len(clients))
			}
			want := map[string][2]int{}
			for _, r := range reps {
				want[r.Name] = [2]int{2, 2} // two sessions, each GET holding one stream slot
			}
			testutil.Eventually(t, "2 sessions and 2 open GETs per replica", func() bool {
				return cmp.Equal(want, e.usage("legacy"))
			})

			for _, c := range clients {
				if err := c.cs.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}
			e.waitSlotsFree("legacy", "slots free once the GET streams closed")
			for sid := range sids {
				if s, err := e.session("legacy", sid); err != nil || s.Status != session.StatusTerminated {
					t.Errorf("session %s after its GET closed: %v %v, want Terminated", sid, s.Status, err)
				}
			}
		})
	}
}

// checkSSEExchanges checks one HTTP+SSE client's exchanges: one GET /sse answered by a
// replica, then POSTs to the flavour's path, all carrying the same session parameter and all
// answered 2xx by the GET's replica. It returns the session id and the replica.
func checkSSEExchanges(t *testing.T, who string, xs []exchange, f sseFlavour) (sid, inst string) {
	t.Helper()
	gets := 0
	for _, x := range xs {
		if x.Method != http.MethodGet {
			continue
		}
		gets++
		if x.URI != "/sse" || x.Status != http.StatusOK || x.Instance == "" {
			t.Fatalf("%s: GET %+v, want 200 from a replica at /sse", who, x)
		}
		inst = x.Instance
	}
	if gets != 1 {
		t.Fatalf("%s: %d GETs, want 1: %+v", who, gets, xs)
	}
	posts := 0
	for _, x := range xs {
		if x.Method != http.MethodPost {
			continue
		}
		posts++
		u, err := url.Parse(x.URI)
		if err != nil {
			t.Fatal(err)
		}
		id := u.Query().Get(f.param)
		if u.Path != f.postPath || id == "" || sid != "" && id != sid {
			t.Errorf("%s: POST %s, want %s?%s=<one session>", who, x.URI, f.postPath, f.param)
		}
		sid = id
		if x.Instance != inst || x.Status/100 != 2 {
			t.Errorf("%s: POST %s answered %d by %q, want 2xx by the GET's replica %q", who, x.URI, x.Status, x.Instance, inst)
		}
	}
	// initialize, notifications/initialized, 3 tool calls, the roots/list reply.
	if posts < 6 {
		t.Errorf("%s: %d POSTs, want ≥ 6", who, posts)
	}
	return sid, inst
}

// TestSSETSClientPinned: three official TypeScript HTTP+SSE clients hold their sessions at
// once over 3 replicas with one session slot each, for both replica flavours: each lands on
// its own replica, and all its calls (roots/list reply included) are served there.
func TestSSETSClientPinned(t *testing.T) { e2e.ForEachKind(t, testSSETSClientPinned) }

func testSSETSClientPinned(t *testing.T, kind e2e.Kind) {
	skipUnlessTS(t)
	for _, sdk := range []string{mcpts.SDKv1, mcpts.SDKv2} {
		for _, f := range sseFlavours {
			t.Run("client "+sdk+"/"+f.name, func(t *testing.T) { testSSETSClient(t, kind, sdk, f) })
		}
	}
}

func testSSETSClient(t *testing.T, kind e2e.Kind, sdk string, f sseFlavour) {
	e, reps := sseEnv(t, kind, &f, 1, "ja", "jb", "jc")
	ctx := testContext(t, 45*time.Second)
	// A POST's exchange may end just after its result arrived on the GET stream.
	want := map[string][2]int{}
	for _, r := range reps {
		want[r.Name] = [2]int{1, 1}
	}
	held := false
	var heldUsage map[string][2]int
	var active []session.Session
	runs := runHeldTSClients(ctx, t, 3, mcpts.ClientConfig{
		URL: e.URL + "/sse", Transport: "sse", Calls: 2, Roots: true, SDK: sdk,
	}, func() {
		held = testutil.Poll(5*time.Second, func() bool { return cmp.Equal(want, e.usage("legacy")) })
		heldUsage = e.usage("legacy")
		for _, s := range e.sessions("legacy") {
			if s.Status == session.StatusActive {
				active = append(active, s)
			}
		}
	})

	boundOn := map[string]string{} // instance → session
	for _, s := range active {
		boundOn[s.Instance] = s.ID
	}
	if !held {
		t.Errorf("while 3 TS clients held, usage (-want +got):\n%s(want 1 session and 1 open GET per replica)", cmp.Diff(want, heldUsage))
	}
	served := map[string]bool{}
	for i, r := range runs {
		if r.err != nil {
			t.Fatalf("TS client %d: %v (events %+v)", i, r.err, r.events)
		}
		calls := tsCalls(r.events)
		if len(calls) != 3 {
			t.Fatalf("TS client %d: %d calls, want 3: %+v", i, len(calls), r.events)
		}
		inst := calls[0].Result.Instance
		served[inst] = true
		sid, ok := boundOn[inst]
		if !ok {
			t.Fatalf("TS client %d served by %q, where tether bound no session (bindings %v)", i, inst, boundOn)
		}
		checkTSCalls(t, fmt.Sprintf("TS client %d", i), calls, inst, f.resultSession(sid))
	}
	if want := replicaNames(reps); len(served) != len(want) {
		t.Errorf("3 concurrent TS sessions with one slot per replica served by %v, want %v", served, want)
	}
	e.waitSlotsFree("legacy", "slots free after the TS clients closed")
}

// TestSSEFirstGETWithQueryRefused: an SSE GET carrying query parameters is refused by tether
// (400, a message naming the rule) before reaching a replica; a POST naming an unknown
// session gets 404.
func TestSSEFirstGETWithQueryRefused(t *testing.T) {
	e2e.ForEachKind(t, testSSEFirstGETWithQueryRefused)
}

func testSSEFirstGETWithQueryRefused(t *testing.T, kind e2e.Kind) {
	f := sseFlavours[0]
	e, _ := sseEnv(t, kind, &f, 20, "qa", "qb", "qc")
	ctx := testContext(t, 20*time.Second)
	tests := []struct {
		name, method, path, body string
		status                   int
		code, message            string
	}{
		{"GET with the session parameter", http.MethodGet, "/sse?sessionid=FORGED", "", http.StatusBadRequest, "InvalidArgument", "may not carry query parameters"},
		{"GET with another parameter", http.MethodGet, "/sse?x=1", "", http.StatusBadRequest, "InvalidArgument", "may not carry query parameters"},
		{"POST to an unknown session", http.MethodPost, "/sse?sessionid=NOSUCHSESSION", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
			http.StatusNotFound, "SessionNotFound", "start a new session"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rej := rawRequest(t, tc.method, e.URL+tc.path, tc.body, "Accept", "text/event-stream", "Content-Type", "application/json")
			if rej.Status != tc.status || rej.ErrorCode != tc.code || !containsFold(rej.ErrorMessage, tc.message) || rej.Instance != "" {
				t.Errorf("%s %s = %+v, want tether's %d %s mentioning %q", tc.method, tc.path, rej, tc.status, tc.code, tc.message)
			}
		})
	}
	if cs, err := connectSSE(ctx, "query", e.URL+"/sse?x=1", nil); err == nil {
		_ = cs.Close()
		t.Error("a Go SSE client connected with a query on its first GET")
	}
	for name, n := range f.requests() {
		if n != 0 {
			t.Errorf("replica %s received %d requests, want 0", name, n)
		}
	}
	if s, r := e.totals("legacy"); s != 0 || r != 0 {
		t.Errorf("refused requests left %d sessions and %d requests", s, r)
	}
}

// TestSSEIdleStreamSurvives keeps an HTTP+SSE session idle for longer than Envoy's default
// route timeout (15 s): the GET stream stays open and the next call is served by the same
// replica in the same session. Skipped with -short.
func TestSSEIdleStreamSurvives(t *testing.T) { e2e.ForEachKind(t, testSSEIdleStreamSurvives) }

func testSSEIdleStreamSurvives(t *testing.T, kind e2e.Kind) {
	if testing.Short() {
		t.Skip("idles for 16 s")
	}
	f := sseFlavours[0]
	reps := startGoReplicas(t, mcpreplica.Options{}, "ia", "ib", "ic")
	e := newEnv(t, kind, []registry.Service{f.service(20)}, instancesOf("legacy", goReplicas(reps)...))
	ctx := testContext(t, 45*time.Second)
	hc, rec := newRecordingClient(t)
	cs, err := connectSSE(ctx, "idle", e.URL+"/sse", hc)
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, cs)
	before, err := call(ctx, cs, "whoami")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(16 * time.Second)
	if u := e.usage("legacy")[before.Instance]; u != [2]int{1, 1} {
		t.Errorf("after 16 s idle, usage of %s = %v, want the session and its GET", before.Instance, u)
	}
	after, err := call(ctx, cs, "whoami")
	if err != nil {
		t.Fatalf("call after 16 s idle: %v", err)
	}
	if after.Instance != before.Instance {
		t.Errorf("served by %q after the idle period, %q before", after.Instance, before.Instance)
	}
	sid, inst := checkSSEExchangesN(t, rec.exchanges(), f)
	if inst != before.Instance {
		t.Errorf("GET served by %q, calls by %q", inst, before.Instance)
	}
	if s, err := e.session("legacy", sid); err != nil || s.Status != session.StatusActive {
		t.Errorf("session after idle: %+v, %v", s, err)
	}
	for _, r := range reps {
		want := 0
		if r.Name == inst {
			want = 1
		}
		if got := r.RequestsFor(http.MethodGet, "/sse"); got != want {
			t.Errorf("replica %s saw %d SSE GETs, want %d (no reconnect)", r.Name, got, want)
		}
	}
}

// checkSSEExchangesN is checkSSEExchanges without the POST count (for short sessions).
func checkSSEExchangesN(t *testing.T, xs []exchange, f sseFlavour) (sid, inst string) {
	t.Helper()
	for _, x := range xs {
		switch x.Method {
		case http.MethodGet:
			inst = x.Instance
		case http.MethodPost:
			u, _ := url.Parse(x.URI)
			sid = u.Query().Get(f.param)
			if x.Instance != inst {
				t.Errorf("POST %s served by %q, GET by %q", x.URI, x.Instance, inst)
			}
		}
	}
	if sid == "" || inst == "" {
		t.Fatalf("no GET/POST seen: %+v", xs)
	}
	return sid, inst
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
