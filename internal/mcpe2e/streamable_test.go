package mcpe2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/mcpts"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// streamableEnv runs Go replicas named ids behind a mcp-streamable service "mcp".
func streamableEnv(t *testing.T, kind e2e.Kind, sessionsPerInstance int, opts mcpreplica.Options, ids ...string) (*env, []*mcpreplica.Server) {
	t.Helper()
	reps := startGoReplicas(t, opts, ids...)
	svc := mcpService("mcp", registry.AffinityMCPStreamable, sessionsPerInstance)
	e := newEnv(t, kind, []registry.Service{svc}, instancesOf("mcp", goReplicas(reps)...))
	logReplicasOnFailure(t, reps)
	return e, reps
}

// TestStreamableConcurrentSessionsPinned runs 24 Go SDK sessions at once (8 pinned to
// 2025-03-26, 8 to 2025-06-18, 8 with default options, which try server/discover at
// 2026-07-28 first and fall back to 2025-11-25) over 3 replicas with 8 session slots each.
// Every call of a session, the server→client roots/list reply POST included, must reach the
// replica that created the session: the tool result's instance, the session id's prefix, the
// instance tether bound and the X-Instance header of every HTTP exchange carrying the session
// id all agree. The slots fill to exactly 8 per replica, and closing frees them all.
func TestStreamableConcurrentSessionsPinned(t *testing.T) {
	e2e.ForEachKind(t, testStreamableConcurrentSessionsPinned)
}

func testStreamableConcurrentSessionsPinned(t *testing.T, kind e2e.Kind) {
	e, reps := streamableEnv(t, kind, 8, mcpreplica.Options{}, "sa", "sb", "sc")
	ctx := testContext(t, 60*time.Second)

	versions := []string{v20250326, v20250618, vDefault}
	const perVersion = 8
	versionOf := func(i int) string { return versions[i/perVersion] }
	clients := runGoClients(ctx, t, perVersion*len(versions), func(ctx context.Context, i int, hc *http.Client) (*mcp.ClientSession, error) {
		return connectStreamable(ctx, fmt.Sprintf("go-%d", i), e.URL, hc, versionOf(i))
	}, "whoami", "whoami", "roots", "whoami")

	ids := map[string]bool{}
	for i, c := range clients {
		if c.err != nil {
			t.Fatalf("client %d (version %q): %v", i, versionOf(i), c.err)
		}
		sid := c.cs.ID()
		inst := instanceOf(sid, names(reps))
		if inst == "" {
			t.Fatalf("client %d: session id %q names no replica", i, sid)
		}
		ids[sid] = true
		wantVersion := versionOf(i)
		if wantVersion == vDefault {
			wantVersion = v20251125 // discover refused by a stateful server, then initialize
		}
		if got := c.cs.InitializeResult().ProtocolVersion; got != wantVersion {
			t.Errorf("client %d: negotiated %q, want %q", i, got, wantVersion)
		}
		checkServed(t, fmt.Sprintf("client %d", i), c.results, inst, sid)
		if r := c.results[2]; r.Roots != clientRoots {
			t.Errorf("client %d: roots tool saw %d roots, want %d (server→client request answered)", i, r.Roots, clientRoots)
		}
		s, err := e.session("mcp", sid)
		if err != nil {
			t.Fatalf("client %d: tether has no session %q: %v", i, sid, err)
		}
		if s.Instance != inst || s.Status != session.StatusActive || s.Kind != session.KindMCPStreamable {
			t.Errorf("client %d: tether's binding = %s on %q (%s), want Active mcp-streamable on %q", i, s.Kind, s.Instance, s.Status, inst)
		}
		posts := 0
		for _, x := range c.rec.exchanges() {
			if x.Session != sid {
				continue
			}
			if x.Instance != inst || x.Status/100 != 2 {
				t.Errorf("client %d: %s %s with session %s answered %d by %q, want 2xx by %q", i, x.Method, x.URI, sid, x.Status, x.Instance, inst)
			}
			if x.Method == http.MethodPost {
				posts++
			}
		}
		// notifications/initialized, 4 tool calls and the client's reply to roots/list.
		if posts < 6 {
			t.Errorf("client %d: %d POSTs carried the session id, want ≥ 6", i, posts)
		}
	}
	if len(ids) != len(clients) {
		t.Fatalf("%d distinct session ids for %d clients", len(ids), len(clients))
	}
	want := map[string][2]int{}
	for _, r := range reps {
		want[r.Name] = [2]int{8, 0}
	}
	// Standalone GET streams hold request slots; count sessions only.
	got := map[string][2]int{}
	for id, u := range e.usage("mcp") {
		got[id] = [2]int{u[0], 0}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sessions per instance (-want +got), 24 sessions filling 3×8 slots:\n%s", diff)
	}

	var cw sync.WaitGroup
	for _, c := range clients {
		cw.Go(func() {
			if err := c.cs.Close(); err != nil {
				t.Errorf("close %s: %v", c.cs.ID(), err)
			}
		})
	}
	cw.Wait()
	e.waitSlotsFree("mcp", "all slots free after the clients closed")
	for sid := range ids {
		if s, err := e.session("mcp", sid); err != nil || s.Status != session.StatusTerminated {
			t.Errorf("session %s after DELETE: %v %v, want Terminated", sid, s.Status, err)
		}
	}
	for _, r := range reps {
		if got := r.RequestsFor(http.MethodDelete, "/mcp"); got != 8 {
			t.Errorf("replica %s saw %d DELETEs, want 8 (its own sessions only)", r.Name, got)
		}
	}
}

// TestStreamableDeleteFreesSlot: with one replica and one session slot, a second session is
// refused (503 NoCapacity, from tether, not the replica) while the first is held, and accepted
// right after the first client's Close (DELETE) returns.
func TestStreamableDeleteFreesSlot(t *testing.T) { e2e.ForEachKind(t, testStreamableDeleteFreesSlot) }

func testStreamableDeleteFreesSlot(t *testing.T, kind e2e.Kind) {
	e, reps := streamableEnv(t, kind, 1, mcpreplica.Options{}, "solo")
	ctx := testContext(t, 30*time.Second)

	first, err := connectStreamable(ctx, "first", e.URL, nil, v20250618)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := call(ctx, first, "whoami"); err != nil || r.Instance != "solo" {
		t.Fatalf("first whoami = %+v, %v", r, err)
	}

	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	rej := rawRequest(t, http.MethodPost, e.URL+"/mcp", initialize,
		"Content-Type", "application/json", "Accept", "application/json, text/event-stream")
	if rej.Status != http.StatusServiceUnavailable || rej.ErrorCode != "NoCapacity" || rej.Instance != "" {
		t.Fatalf("second initialize while the slot is held = %+v, want tether's 503 NoCapacity", rej)
	}
	if _, err := connectStreamable(ctx, "refused", e.URL, nil, v20250618); err == nil {
		t.Fatal("a Go client connected while the only session slot was held")
	}
	if u := e.usage("mcp")["solo"]; u[0] != 1 {
		t.Fatalf("sessions on solo = %d, want 1", u[0])
	}

	firstID := first.ID()
	if err := first.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	second, err := connectStreamable(ctx, "second", e.URL, nil, v20250618)
	if err != nil {
		t.Fatalf("connect right after DELETE: %v", err)
	}
	closeAtEnd(t, second)
	r, err := call(ctx, second, "whoami")
	if err != nil || r.Instance != "solo" || r.Session != second.ID() || second.ID() == firstID {
		t.Fatalf("second session whoami = %+v (id %s, first %s), %v", r, second.ID(), firstID, err)
	}
	if s, err := e.session("mcp", firstID); err != nil || s.Status != session.StatusTerminated {
		t.Errorf("first session = %v, %v; want Terminated", s.Status, err)
	}
	if got := reps[0].RequestsFor(http.MethodDelete, "/mcp"); got != 1 {
		t.Errorf("DELETEs at the replica = %d, want 1", got)
	}
}

// TestStreamableInstanceLost: a replica crashes and tether learns it (health check verdict, or
// the instance deregistered). Its client's next call fails with 404, which the Go SDK reports
// as mcp.ErrSessionMissing; a bystander session on another replica is untouched; a new
// Connect lands on a live replica.
func TestStreamableInstanceLost(t *testing.T) { e2e.ForEachKind(t, testStreamableInstanceLost) }

func testStreamableInstanceLost(t *testing.T, kind e2e.Kind) {
	tests := []struct {
		name string
		lose func(*env, registry.Key) error
	}{
		{"unhealthy", func(e *env, k registry.Key) error {
			_, err := e.fx.Registry.SetHealth(k, registry.HealthUnhealthy)
			return err
		}},
		{"deregistered", func(e *env, k registry.Key) error { return e.fx.Registry.Deregister(k) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, reps := streamableEnv(t, kind, 1, mcpreplica.Options{}, "ka", "kb", "kc", "kd")
			ctx := testContext(t, 30*time.Second)
			byName := map[string]*mcpreplica.Server{}
			for _, r := range reps {
				byName[r.Name] = r
			}

			victim, err := connectStreamable(ctx, "victim", e.URL, nil, v20250618)
			if err != nil {
				t.Fatal(err)
			}
			closeAtEnd(t, victim)
			bystander, err := connectStreamable(ctx, "bystander", e.URL, nil, v20250326)
			if err != nil {
				t.Fatal(err)
			}
			closeAtEnd(t, bystander)
			lost := instanceOf(victim.ID(), names(reps))
			kept := instanceOf(bystander.ID(), names(reps))
			if lost == "" || kept == "" || lost == kept {
				t.Fatalf("sessions %q and %q: want two different replicas (one slot each)", victim.ID(), bystander.ID())
			}
			if r, err := call(ctx, victim, "whoami"); err != nil || r.Instance != lost {
				t.Fatalf("victim whoami = %+v, %v", r, err)
			}

			byName[lost].Close() // crash: open streams cut
			if err := tc.lose(e, registry.Key{Service: "mcp", ID: lost}); err != nil {
				t.Fatal(err)
			}
			e.fx.Sync(t) // the engine follows the registry on its own goroutine

			_, err = call(ctx, victim, "whoami")
			if !errors.Is(err, mcp.ErrSessionMissing) {
				t.Fatalf("call after the instance was lost: %v, want mcp.ErrSessionMissing (HTTP 404)", err)
			}
			if s, err := e.session("mcp", victim.ID()); err != nil || s.Status != session.StatusTerminated {
				t.Errorf("lost session = %v, %v; want Terminated", s.Status, err)
			}
			rej := rawRequest(t, http.MethodPost, e.URL+"/mcp", `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`,
				"Content-Type", "application/json", "Accept", "application/json, text/event-stream",
				"Mcp-Session-Id", victim.ID(), "Mcp-Protocol-Version", v20250618)
			if rej.Status != http.StatusNotFound || rej.ErrorCode != "SessionNotFound" {
				t.Errorf("raw request with the lost session id = %+v, want 404 SessionNotFound", rej)
			}

			if r, err := call(ctx, bystander, "whoami"); err != nil || r.Instance != kept || r.Session != bystander.ID() {
				t.Errorf("bystander whoami = %+v, %v; want still on %q", r, err, kept)
			}

			again, err := connectStreamable(ctx, "again", e.URL, nil, v20250618)
			if err != nil {
				t.Fatalf("re-initialise: %v", err)
			}
			closeAtEnd(t, again)
			now := instanceOf(again.ID(), names(reps))
			r, err := call(ctx, again, "whoami")
			if err != nil || r.Instance != now || now == lost || now == kept || now == "" {
				t.Fatalf("re-initialised session %q served by %+v (%v); want a live free replica, not %q or %q", again.ID(), r, err, lost, kept)
			}
			if s, err := e.session("mcp", again.ID()); err != nil || s.Instance != now {
				t.Errorf("binding of the new session = %+v, %v; want %q", s, err, now)
			}
		})
	}
}

// TestStreamableStatelessBalanced: replicas serving 2026-07-28 statelessly and a Go client
// with default options (server/discover succeeds, no session). Each request is balanced on its
// own: one client's calls reach several replicas, and tether learns nothing.
func TestStreamableStatelessBalanced(t *testing.T) {
	e2e.ForEachKind(t, testStreamableStatelessBalanced)
}

func testStreamableStatelessBalanced(t *testing.T, kind e2e.Kind) {
	e, reps := streamableEnv(t, kind, 20, mcpreplica.Options{Stateless: true}, "la", "lb", "lc")
	ctx := testContext(t, 30*time.Second)
	hc, rec := newRecordingClient(t)
	cs, err := connectStreamable(ctx, "stateless", e.URL, hc, vDefault)
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, cs)
	if got := cs.InitializeResult().ProtocolVersion; got != v20260728 {
		t.Fatalf("negotiated %q, want %q", got, v20260728)
	}
	if cs.ID() != "" {
		t.Fatalf("stateless exchange got session id %q", cs.ID())
	}
	served := map[string]int{}
	for range 6 {
		r, err := call(ctx, cs, "whoami")
		if err != nil {
			t.Fatal(err)
		}
		if r.Session != "" {
			t.Errorf("stateless call reports session %q", r.Session)
		}
		served[r.Instance]++
	}
	if len(served) < 2 {
		t.Errorf("6 calls of one client served by %v, want ≥ 2 replicas", served)
	}
	for _, x := range rec.exchanges() {
		if x.Session != "" || x.Status/100 != 2 || !slices.Contains(names(reps), x.Instance) {
			t.Errorf("exchange %+v: want 2xx from a replica, without a session id", x)
		}
	}
	if ss := e.sessions("mcp"); len(ss) != 0 {
		t.Errorf("tether learned sessions from stateless traffic: %+v", ss)
	}
	if s, _ := e.totals("mcp"); s != 0 {
		t.Errorf("stateless traffic holds %d session slots", s)
	}
}

// TestStreamableRefusesOtherTraffic: HTTP+SSE-style requests to a Streamable HTTP service are
// refused by tether with a clear error (400 TransportMismatch), unknown session ids get 404
// SessionNotFound, and none of it reaches a replica.
func TestStreamableRefusesOtherTraffic(t *testing.T) {
	e2e.ForEachKind(t, testStreamableRefusesOtherTraffic)
}

func testStreamableRefusesOtherTraffic(t *testing.T, kind e2e.Kind) {
	e, reps := streamableEnv(t, kind, 20, mcpreplica.Options{}, "ra", "rb", "rc")
	ctx := testContext(t, 30*time.Second)
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	tests := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, message            string
	}{
		{"SSE GET", http.MethodGet, "/sse", "", []string{"Accept", "text/event-stream"},
			http.StatusBadRequest, "TransportMismatch", "HTTP+SSE"},
		{"POST with a Go-style session parameter", http.MethodPost, "/sse?sessionid=ABC", body, []string{"Content-Type", "application/json"},
			http.StatusBadRequest, "TransportMismatch", "HTTP+SSE"},
		{"POST with a TS-style session parameter", http.MethodPost, "/messages?sessionId=0b7e", body, []string{"Content-Type", "application/json"},
			http.StatusBadRequest, "TransportMismatch", "incompatible"},
		{"unknown session id", http.MethodPost, "/mcp", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			[]string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream", "Mcp-Session-Id", "ra-NOSUCHSESSION"},
			http.StatusNotFound, "SessionNotFound", "start a new session"},
		{"GET with an unknown session id", http.MethodGet, "/mcp", "",
			[]string{"Accept", "text/event-stream", "Mcp-Session-Id", "rb-NOSUCHSESSION"},
			http.StatusNotFound, "SessionNotFound", "start a new session"},
		{"DELETE with an unknown session id", http.MethodDelete, "/mcp", "", []string{"Mcp-Session-Id", "rc-NOSUCHSESSION"},
			http.StatusNotFound, "SessionNotFound", "start a new session"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rej := rawRequest(t, tc.method, e.URL+tc.path, tc.body, tc.headers...)
			if rej.Status != tc.status || rej.ErrorCode != tc.code || !strings.Contains(rej.ErrorMessage, tc.message) || rej.Instance != "" {
				t.Errorf("%s %s = %+v, want tether's %d %s mentioning %q", tc.method, tc.path, rej, tc.status, tc.code, tc.message)
			}
		})
	}
	t.Run("Go SSE client", func(t *testing.T) {
		cs, err := connectSSE(ctx, "go-sse", e.URL+"/sse", nil)
		if err == nil {
			_ = cs.Close()
			t.Fatal("a Go HTTP+SSE client connected to a Streamable HTTP service")
		}
	})
	t.Run("TS SSE client", func(t *testing.T) {
		skipUnlessTS(t)
		events, err := mcpts.RunClient(ctx, mcpts.ClientConfig{URL: e.URL + "/sse", Transport: "sse", Calls: 1})
		if err == nil {
			t.Fatalf("a TS HTTP+SSE client connected to a Streamable HTTP service: %+v", events)
		}
	})
	for _, r := range reps {
		if n := r.Requests(); n != 0 {
			t.Errorf("replica %s received %d requests, want 0 (all refused by tether)", r.Name, n)
		}
	}
}

// TestStreamableTSClient runs the official TypeScript client through the data plane against
// Go replicas, at the SDK's 2025-11-25 and with replicas that negotiate down to 2025-06-18:
// every call (roots/list reply included) is served by the replica that issued the session,
// which is where tether bound it, and terminateSession (DELETE) ends the binding.
func TestStreamableTSClient(t *testing.T) { e2e.ForEachKind(t, testStreamableTSClient) }

func testStreamableTSClient(t *testing.T, kind e2e.Kind) {
	skipUnlessTS(t)
	tests := []struct {
		name     string
		sdk      string
		versions []string
		want     string
	}{
		{"sdk 1.x at 2025-11-25", mcpts.SDKv1, nil, v20251125},
		{"sdk 1.x, replicas at 2025-06-18", mcpts.SDKv1, []string{v20250618}, v20250618},
		{"client 2.x at 2025-11-25", mcpts.SDKv2, nil, v20251125},
		{"client 2.x, replicas at 2025-06-18", mcpts.SDKv2, []string{v20250618}, v20250618},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, reps := streamableEnv(t, kind, 1, mcpreplica.Options{ProtocolVersions: tc.versions}, "ta", "tb", "tc")
			ctx := testContext(t, 45*time.Second)
			// Three clients hold their sessions at once, one session slot per replica: each
			// must be on its own replica.
			var held map[string][2]int
			runs := runHeldTSClients(ctx, t, 3, mcpts.ClientConfig{
				URL: e.URL + "/mcp", Transport: "streamable", Calls: 3, Roots: true, Terminate: true, SDK: tc.sdk,
			}, func() { held = e.usage("mcp") })
			for _, r := range reps {
				if held[r.Name][0] != 1 {
					t.Errorf("while 3 TS sessions were held, sessions per instance = %v, want 1 each", held)
				}
			}
			used := map[string]bool{}
			for i, r := range runs {
				if r.err != nil {
					t.Fatalf("TS client %d: %v (events %+v)", i, r.err, r.events)
				}
				sid := r.events[0].SessionID
				inst := instanceOf(sid, names(reps))
				if r.events[0].Event != "connected" || inst == "" {
					t.Fatalf("TS client %d: first event %+v, want connected with a replica's session id", i, r.events[0])
				}
				if got := r.events[0].ProtocolVersion; got != tc.want {
					t.Errorf("TS client %d negotiated %q, want %q", i, got, tc.want)
				}
				used[inst] = true
				calls := tsCalls(r.events)
				if len(calls) != 4 {
					t.Fatalf("TS client %d: %d calls, want 4: %+v", i, len(calls), r.events)
				}
				checkTSCalls(t, fmt.Sprintf("TS client %d", i), calls, inst, sid)
				s, err := e.session("mcp", sid)
				if err != nil || s.Instance != inst || s.Status != session.StatusTerminated {
					t.Errorf("TS client %d: binding %+v, %v; want Terminated on %q", i, s, err, inst)
				}
			}
			if len(used) != 3 {
				t.Errorf("3 concurrent TS sessions with one slot per replica used %v, want all 3 replicas", used)
			}
			e.waitSlotsFree("mcp", "slots free after terminateSession")
		})
	}
}
