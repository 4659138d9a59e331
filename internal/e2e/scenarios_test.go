package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestCookieAffinity: the first response sets the session cookie beside the upstream's own;
// a real cookie jar sends both back and the next 50 requests, each on a fresh connection, reach
// the same instance.
func TestCookieAffinity(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		svc := service("web", registry.AffinityCookie)
		e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"web": instances("i1", "i2", "i3")})
		c := newClient(t, true)

		first := do(t, c, "GET", e.DP.URL()+"/login", "X-Upstream-Set-Cookie", "app=42; Path=/")
		if first.status != 200 || first.instance == "" {
			t.Fatalf("first request: %d from %q", first.status, first.instance)
		}
		id := setCookie(first.header, "tether-session")
		if len(id) != 32 || setCookie(first.header, "app") != "42" {
			t.Fatalf("Set-Cookie %q: want tether-session (32 hex) and the upstream's app=42", first.header.Values("Set-Cookie"))
		}
		for i := range 50 {
			r := do(t, c, "GET", fmt.Sprintf("%s/page/%d", e.DP.URL(), i))
			if r.status != 200 || r.instance != first.instance {
				t.Fatalf("request %d: %d from %q, want 200 from %q", i, r.status, r.instance, first.instance)
			}
			if r.header.Get("Set-Cookie") != "" {
				t.Errorf("request %d: an existing session got Set-Cookie %q", i, r.header.Values("Set-Cookie"))
			}
		}
		seen := e.Upstream("web", first.instance).Requests()
		last := seen[len(seen)-1].Header.Get("Cookie")
		if !strings.Contains(last, "app=42") || !strings.Contains(last, "tether-session="+id) {
			t.Errorf("upstream got Cookie %q, want the application's cookie beside tether's", last)
		}
		if s, err := e.Fixture.Engine.GetSession(context.Background(), "web", id); err != nil || s.Instance != first.instance {
			t.Errorf("session %s: %+v, %v; want bound to %s", id, s, err, first.instance)
		}
		e.WaitSlotsReleased(t)
	})
}

// TestHeaderFieldAffinity: generated ids come back in the header field; client-supplied ids are
// the session id; each session sticks to its instance; with one session per instance a fourth
// session finds no capacity.
func TestHeaderFieldAffinity(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		svc := service("api", registry.AffinityHeader)
		svc.SessionsPerInstance = 1
		e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"api": instances("i1", "i2", "i3")})
		c := newClient(t, false)

		gen := do(t, c, "GET", e.DP.URL()+"/")
		id := gen.header.Get("X-Tether-Session")
		if gen.status != 200 || len(id) != 32 {
			t.Fatalf("generated: %d, X-Tether-Session %q; want 200 and a generated id", gen.status, id)
		}
		placed := map[string]string{id: gen.instance}
		for _, client := range []string{"client_a", "client-b_2"} {
			r := do(t, c, "GET", e.DP.URL()+"/", "X-Tether-Session", client)
			if r.status != 200 {
				t.Fatalf("%s: %d %s", client, r.status, r.body)
			}
			if r.header.Get("X-Tether-Session") != "" {
				t.Errorf("%s: a client-supplied id was echoed: %q", client, r.header.Get("X-Tether-Session"))
			}
			placed[client] = r.instance
		}
		distinct := map[string]bool{}
		for sid, inst := range placed {
			distinct[inst] = true
			for i := range 10 {
				if r := do(t, c, "GET", e.DP.URL()+"/", "X-Tether-Session", sid); r.instance != inst {
					t.Fatalf("session %s request %d went to %q, want %q", sid, i, r.instance, inst)
				}
			}
		}
		if len(distinct) != 3 {
			t.Errorf("sessions placed on %v, want three instances (1 session per instance)", placed)
		}
		full := do(t, c, "GET", e.DP.URL()+"/", "X-Tether-Session", "client_d")
		if full.status != 503 || full.header.Get("Retry-After") == "" || errorBody(t, full) != "NoCapacity" {
			t.Errorf("fourth session: %d retry-after %q %s, want 503 NoCapacity with retry-after", full.status, full.header.Get("Retry-After"), full.body)
		}
		bad := do(t, c, "GET", e.DP.URL()+"/", "X-Tether-Session", "bad id!")
		if bad.status != 400 || errorBody(t, bad) != "InvalidSessionId" {
			t.Errorf("malformed id: %d %s, want 400 InvalidSessionId", bad.status, bad.body)
		}
		e.WaitSlotsReleased(t)
	})
}

// TestStickyRoundRobin: new requests go round robin; a response where the application creates
// its session (JSESSIONID) gets the sticky cookie; sticky requests stay on their instance while it
// is healthy and move (once, then stick again) when it turns unhealthy.
func TestStickyRoundRobin(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		svc := service("shop", registry.AffinityNone)
		svc.Balancing = registry.BalanceStickyRoundRobin
		svc.Sticky.UpstreamCookie = "JSESSIONID"
		e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"shop": instances("i1", "i2", "i3")})

		anon := newClient(t, true)
		counts := map[string]int{}
		for range 9 {
			r := do(t, anon, "GET", e.DP.URL()+"/catalog")
			counts[r.instance]++
			if r.header.Get("Set-Cookie") != "" {
				t.Errorf("no application session, yet Set-Cookie %q", r.header.Values("Set-Cookie"))
			}
		}
		if counts["i1"] != 3 || counts["i2"] != 3 || counts["i3"] != 3 {
			t.Errorf("new requests spread %v, want round robin 3/3/3", counts)
		}

		c := newClient(t, true)
		login := do(t, c, "POST", e.DP.URL()+"/login", "X-Upstream-Set-Cookie", "JSESSIONID=app1; Path=/")
		if setCookie(login.header, "tether-session") == "" || setCookie(login.header, "JSESSIONID") != "app1" {
			t.Fatalf("login Set-Cookie %q, want the sticky cookie beside JSESSIONID", login.header.Values("Set-Cookie"))
		}
		home := login.instance
		for i := range 10 {
			if r := do(t, c, "GET", e.DP.URL()+"/cart"); r.instance != home {
				t.Fatalf("sticky request %d went to %q, want %q", i, r.instance, home)
			}
		}

		if _, err := e.Fixture.Registry.SetHealth(e2e.Key("shop", home), registry.HealthUnhealthy); err != nil {
			t.Fatal(err)
		}
		e.Fixture.Sync(t)
		e.WaitEndpoints(t)
		moved := do(t, c, "GET", e.DP.URL()+"/cart")
		if moved.status != 200 || moved.instance == home || moved.instance == "" {
			t.Fatalf("after %s turned unhealthy: %d from %q, want another instance", home, moved.status, moved.instance)
		}
		for i := range 10 {
			if r := do(t, c, "GET", e.DP.URL()+"/cart"); r.instance != moved.instance {
				t.Fatalf("after the move, request %d went to %q, want %q", i, r.instance, moved.instance)
			}
		}
		if n := e.Upstream("shop", home).Served(); n != 1+10+3 {
			t.Errorf("unhealthy %s served %d requests in total, want 14 (3 anonymous, login, 10 sticky) and none after", home, n)
		}
		e.WaitSlotsReleased(t)
	})
}

// TestSeedScenario1: two sessions per instance. Client 1 and 2 share instance 1; client 3 finds it
// full and lands on a new instance (scale-out onto a standby).
func TestSeedScenario1(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		svc := service("fn", registry.AffinityCookie)
		svc.SessionsPerInstance = 2
		e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"fn": {
			{ID: "instance1"}, {ID: "instance2", State: registry.StateStandby}, {ID: "instance3", State: registry.StateStandby},
		}})
		want := []string{"instance1", "instance1", "instance2"}
		for i, w := range want {
			c := newClient(t, true)
			r := do(t, c, "GET", e.DP.URL()+"/")
			if r.instance != w {
				t.Fatalf("client %d on %q, want %q", i+1, r.instance, w)
			}
			for range 5 {
				if again := do(t, c, "GET", e.DP.URL()+"/"); again.instance != w {
					t.Fatalf("client %d moved to %q", i+1, again.instance)
				}
			}
		}
		// The engine signals scale-out when client 3's session goes to the standby (it may
		// repeat the signal while the service stays scaled out); never onto another instance.
		so := e.Fixture.ScaleOuts()
		if len(so) == 0 || so[0].Desired != 2 {
			t.Errorf("scale-outs %+v, want a first signal for 2 instances", so)
		}
		for _, s := range so {
			if s.Instance.ID != "instance2" {
				t.Errorf("scale-out onto %s, want only instance2", s.Instance.ID)
			}
		}
		e.WaitSlotsReleased(t)
	})
}

// TestSeedScenario2: two sessions on one instance hold all 200 request slots with requests the
// upstream blocks; the 201st request of a session gets 429 with retry-after, while a new session is
// served by another instance. When the upstream lets go, all 200 complete and the slots return.
func TestSeedScenario2(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		svc := service("fn", registry.AffinityCookie)
		svc.SessionsPerInstance = 2
		e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"fn": instances("instance1", "instance2")})
		c1, c2 := newClient(t, true), newClient(t, true)
		for i, c := range []*http.Client{c1, c2} {
			if r := do(t, c, "GET", e.DP.URL()+"/"); r.instance != "instance1" {
				t.Fatalf("client %d on %q, want instance1", i+1, r.instance)
			}
		}
		up := e.Upstream("fn", "instance1")
		var wg sync.WaitGroup
		statuses := make(chan int, 200)
		for i := range 200 {
			c := c1
			if i%2 == 1 {
				c = c2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := doCtx(context.Background(), c, "GET", e.DP.URL()+"/block")
				if err != nil {
					statuses <- -1
					return
				}
				statuses <- r.status
			}()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := up.WaitBlocked(ctx, 200); err != nil {
			up.Release()
			if h := e.Harness(); h != nil {
				t.Logf("harness %+v", h.Stats())
			}
			t.Fatalf("%v (ext_proc %+v, requests in flight %d)", err, e.ExtProc.Stats(), e.RequestsInFlight(t, "fn"))
		}
		for i, c := range []*http.Client{c1, c2} {
			r := do(t, c, "GET", e.DP.URL()+"/")
			if r.status != 429 || r.header.Get("Retry-After") == "" || errorBody(t, r) != "ResourceExhausted" {
				t.Errorf("client %d's 201st request: %d retry-after %q %s, want 429 ResourceExhausted", i+1, r.status, r.header.Get("Retry-After"), r.body)
			}
		}
		if r := do(t, newClient(t, true), "GET", e.DP.URL()+"/"); r.status != 200 || r.instance != "instance2" {
			t.Errorf("a new session during the overload: %d on %q, want 200 on instance2", r.status, r.instance)
		}
		up.Release()
		wg.Wait()
		close(statuses)
		for st := range statuses {
			if st != 200 {
				t.Errorf("a held request finished with %d, want 200", st)
			}
		}
		e.WaitSlotsReleased(t)
	})
}

// TestForgedIdentifiersNeverChooseTheInstance: a client-supplied destination header or a forged
// session cookie never sends a request anywhere tether did not choose.
func TestForgedIdentifiersNeverChooseTheInstance(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		rr := service("rr", registry.AffinityNone)
		rr.Match = registry.Match{PathPrefix: "/rr"}
		ck := service("ck", registry.AffinityCookie)
		ck.Match = registry.Match{PathPrefix: "/ck"}
		e := e2e.Start(t, kind, []registry.Service{rr, ck}, map[string][]e2e.Instance{
			"rr": instances("i1", "i2", "i3"), "ck": instances("c1", "c2", "c3"),
		})
		rogue, err := upstream.Start("rogue") // a live server that is no instance of anything
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rogue.Close() })
		c := newClient(t, false)
		target := e.Upstream("rr", "i3").Addr()
		counts := map[string]int{}
		for i := range 30 {
			forged := target
			if i%2 == 1 {
				forged = rogue.Addr() + "," + target
			}
			r := do(t, c, "GET", e.DP.URL()+"/rr", "x-gateway-destination-endpoint", forged)
			if r.status != 200 {
				t.Fatalf("request %d: %d %s", i, r.status, r.body)
			}
			counts[r.instance]++
		}
		if counts["i1"] != 10 || counts["i2"] != 10 || counts["i3"] != 10 {
			t.Errorf("with a forged destination header requests went %v, want tether's round robin 10/10/10", counts)
		}
		if rogue.Served() != 0 {
			t.Errorf("the rogue server outside EDS got %d requests", rogue.Served())
		}
		for _, id := range []string{"i1", "i2", "i3"} {
			u := e.Upstream("rr", id)
			for _, req := range u.Requests() {
				if got := req.Header.Get("X-Gateway-Destination-Endpoint"); got != u.Addr() {
					t.Errorf("%s received destination header %q, want tether's %q", id, got, u.Addr())
				}
			}
		}

		// A well-formed cookie tether never issued starts a new session under a new id, placed by
		// the rules (the fullest instance with room: the one the first session is on).
		jar := newClient(t, true)
		home := do(t, jar, "GET", e.DP.URL()+"/ck").instance
		forgedID := strings.Repeat("ab", 16)
		r := do(t, c, "GET", e.DP.URL()+"/ck", "Cookie", "tether-session="+forgedID,
			"x-gateway-destination-endpoint", e.Upstream("ck", "c3").Addr())
		if r.status != 200 || r.instance != home {
			t.Errorf("forged cookie: %d on %q, want a new session placed on %q", r.status, r.instance, home)
		}
		if got := setCookie(r.header, "tether-session"); got == "" || got == forgedID {
			t.Errorf("forged cookie: Set-Cookie id %q, want a fresh id (never the forged one)", got)
		}
		if _, err := e.Fixture.Engine.GetSession(context.Background(), "ck", forgedID); err == nil {
			t.Error("the forged id became a session")
		}
		bad := do(t, c, "GET", e.DP.URL()+"/ck", "Cookie", "tether-session=../../c3")
		if bad.status != 400 || errorBody(t, bad) != "InvalidSessionId" {
			t.Errorf("malformed cookie: %d %s, want 400 InvalidSessionId", bad.status, bad.body)
		}
		e.WaitSlotsReleased(t)
	})
}

// TestForgedHeaderWithoutEarlyRemoval shows tether's overwrite alone is enough: the harness here
// does not model the connection manager's early removal of the destination header. It runs
// with Envoy's reading of the mutation and with gRFC A93's (proxyless gRPC), which ignores the
// legacy append field and appends by default: only an explicit OVERWRITE_IF_EXISTS_OR_ADD
// (asserted on the wire in pkg/extproc) keeps the forged value from reaching the upstream.
func TestForgedHeaderWithoutEarlyRemoval(t *testing.T) {
	for _, tc := range []struct {
		name string
		sem  envoyharness.Semantics
	}{{"envoy", envoyharness.EnvoySemantics}, {"a93", envoyharness.GRPCSemantics}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service("rr", registry.AffinityNone)
			e := e2e.Start(t, e2e.KindHarness, []registry.Service{svc}, map[string][]e2e.Instance{"rr": instances("i1", "i2")},
				e2e.WithoutEarlyHeaderRemoval(), e2e.WithHarnessOptions(envoyharness.WithMutationSemantics(tc.sem)))
			c := newClient(t, false)
			forged := e.Upstream("rr", "i2").Addr()
			for range 10 {
				do(t, c, "GET", e.DP.URL()+"/", "x-gateway-destination-endpoint", forged)
			}
			if a, b := e.Upstream("rr", "i1").Served(), e.Upstream("rr", "i2").Served(); a != 5 || b != 5 {
				t.Errorf("served i1=%d i2=%d, want tether's 5/5", a, b)
			}
			for _, id := range []string{"i1", "i2"} {
				u := e.Upstream("rr", id)
				for _, req := range u.Requests() {
					if got := req.Header.Values("X-Gateway-Destination-Endpoint"); len(got) != 1 || got[0] != u.Addr() {
						t.Errorf("%s received destination header %q, want only tether's %q", id, got, u.Addr())
					}
				}
			}
		})
	}
}

// TestSlotsReleasedOnClientAbort: clients that give up mid-request free their slots.
func TestSlotsReleasedOnClientAbort(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		for _, fullDuplex := range []bool{false, true} {
			t.Run(fmt.Sprintf("fullDuplex=%v", fullDuplex), func(t *testing.T) { slotsReleasedOnClientAbort(t, kind, fullDuplex) })
		}
	})
}

func slotsReleasedOnClientAbort(t *testing.T, kind e2e.Kind, fullDuplex bool) {
	svc := service("web", registry.AffinityCookie)
	svc.FullDuplexBodies = fullDuplex
	e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"web": instances("i1")})
	c := newClient(t, true)
	do(t, c, "GET", e.DP.URL()+"/")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = doCtx(ctx, c, "GET", e.DP.URL()+"/block")
		}()
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	if err := e.Upstream("web", "i1").WaitBlocked(wctx, 20); err != nil {
		t.Fatal(err)
	}
	if n := e.RequestsInFlight(t, "web"); n != 20 {
		t.Errorf("requests in flight = %d, want 20", n)
	}
	cancel()
	wg.Wait()
	e.WaitSlotsReleased(t)
	testutil.Eventually(t, "upstream handlers cancelled", func() bool { return e.Upstream("web", "i1").Blocked() == 0 })
}

// TestMCPSSEThroughTheDataPlane: the SSE GET's body streams through ext_proc until the endpoint
// event names the session; POSTs with that id reach the same instance until the GET ends.
func TestMCPSSEThroughTheDataPlane(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		tests := []struct {
			name, param, framing, split string
			fullDuplex                  bool // bodyMode full-duplex: every chunk through ext_proc
		}{
			{"TS style LF", "sessionId", "lf", "0", false},
			{"Go style CRLF split", "sessionid", "crlf", "5", false},
			{"CR framing byte by byte", "sessionId", "cr", "1", false},
			{"full duplex, CRLF split", "sessionId", "crlf", "3", true},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				svc := service("mcp", registry.AffinityMCPSSE)
				svc.SSE.SessionParam = tc.param
				svc.FullDuplexBodies = tc.fullDuplex
				e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"mcp": instances("m1", "m2", "m3")})
				c := newClient(t, false)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", e.DP.URL()+"/sse", nil)
				req.Header.Set("X-Upstream-SSE-Framing", tc.framing)
				req.Header.Set("X-Upstream-SSE-Split", tc.split)
				req.Header.Set("X-Upstream-SSE-Param", tc.param)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = resp.Body.Close() }()
				home := resp.Header.Get(upstream.InstanceHeader)
				endpoint := readEndpoint(t, bufio.NewReader(resp.Body))
				u, err := url.Parse(endpoint)
				if err != nil {
					t.Fatal(err)
				}
				id := u.Query().Get(tc.param)
				testutil.Eventually(t, "session learned", func() bool { return e.ExtProc.Stats().SessionsLearned == 1 })
				if got := e.ExtProc.Stats().BodiesStreamed; (got == 0) != tc.fullDuplex {
					t.Errorf("mode overrides to a STREAMED body: %d; want one exactly when bodies are not full duplex already", got)
				}
				for i := range 5 {
					r := do(t, c, "POST", e.DP.URL()+endpoint)
					if r.status != 200 || r.instance != home {
						t.Fatalf("POST %d: %d on %q, want 200 on the SSE stream's %q", i, r.status, r.instance, home)
					}
				}
				cancel() // the client closes the SSE stream
				testutil.Eventually(t, "session ends with its stream", func() bool {
					r := do(t, c, "POST", e.DP.URL()+"/messages?"+tc.param+"="+id)
					return r.status == 404
				})
				e.WaitSlotsReleased(t)
			})
		}
	})
}

// readEndpoint reads SSE lines (any framing) until the endpoint event's data line.
func readEndpoint(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var buf strings.Builder
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := r.ReadByte()
		if err != nil {
			t.Fatalf("reading SSE: %v (got %q)", err, buf.String())
		}
		buf.WriteByte(b)
		s := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(buf.String())
		if i := strings.Index(s, "event: endpoint\ndata: "); i >= 0 {
			rest := s[i+len("event: endpoint\ndata: "):]
			if j := strings.Index(rest, "\n"); j >= 0 {
				return rest[:j]
			}
		}
	}
	t.Fatalf("no endpoint event in %q", buf.String())
	return ""
}
