package e2e_test

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestGatewayAPISessionPersistence ports the Gateway API session-persistence conformance
// checks planned for GEP-1619 (kubernetes-sigs/gateway-api PR #4954) to tether's settings
// (README "Gateway API session persistence"): every follow-up goes out on a fresh connection,
// so routing is driven by the cookie, not by connection reuse. The GRPCRoute header case is
// TestGRPCHeaderSessionsAndRejections.
func TestGatewayAPISessionPersistence(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind e2e.Kind) {
		t.Run("cookie: first response sets it, 50 follow-ups reach one instance; Permanent Max-Age = absoluteTimeout", func(t *testing.T) {
			svc := service("web", registry.AffinityCookie)
			svc.SessionTTL = time.Hour // absoluteTimeout: 1h
			e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"web": instances("i1", "i2", "i3")})
			c := newClient(t, true)
			first := do(t, c, "GET", e.DP.URL()+"/")
			ck := cookieNamed(first.header, "tether-session")
			if first.status != 200 || ck == nil {
				t.Fatalf("first response: %d, Set-Cookie %q; want the session cookie", first.status, first.header.Values("Set-Cookie"))
			}
			if ck.MaxAge != 3600 || !ck.Expires.IsZero() {
				t.Errorf("Permanent cookie: Max-Age %d, Expires %v; want Max-Age 3600 (absoluteTimeout 1h)", ck.MaxAge, ck.Expires)
			}
			for i := range 50 {
				if r := do(t, c, "GET", fmt.Sprintf("%s/%d", e.DP.URL(), i)); r.status != 200 || r.instance != first.instance {
					t.Fatalf("follow-up %d: %d on %q, want %q", i, r.status, r.instance, first.instance)
				}
			}
		})

		t.Run("cookie: Session lifetime has no Max-Age or Expires", func(t *testing.T) {
			svc := service("web", registry.AffinityCookie)
			svc.Cookie.SessionLifetime = true
			e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"web": instances("i1", "i2")})
			r := do(t, newClient(t, false), "GET", e.DP.URL()+"/")
			raw := ""
			for _, v := range r.header.Values("Set-Cookie") {
				if strings.HasPrefix(v, "tether-session=") {
					raw = v
				}
			}
			low := strings.ToLower(raw)
			if raw == "" || strings.Contains(low, "max-age") || strings.Contains(low, "expires") {
				t.Errorf("Set-Cookie %q: want a session cookie without Max-Age and Expires", raw)
			}
			// Still a session: the cookie routes.
			c := newClient(t, true)
			first := do(t, c, "GET", e.DP.URL()+"/")
			for i := range 10 {
				if got := do(t, c, "GET", e.DP.URL()+"/").instance; got != first.instance {
					t.Fatalf("follow-up %d on %q, want %q", i, got, first.instance)
				}
			}
		})

		t.Run("70/30 weights: the initial split follows the weights, then sessions stick", func(t *testing.T) {
			// Weighted placement of new cookie sessions is sticky round robin (affinity none,
			// balancing sticky-round-robin; see the README mapping); cookie affinity places by
			// session quota instead, filling the fullest instance with room.
			svc := service("web", registry.AffinityNone)
			svc.Balancing = registry.BalanceStickyRoundRobin
			e := e2e.Start(t, kind, []registry.Service{svc}, map[string][]e2e.Instance{"web": {
				{ID: "heavy", Weight: 70}, {ID: "light", Weight: 30},
			}})
			const n = 500 // the conformance harness's weighted-check size
			counts := map[string]int{}
			type sess struct {
				c    *http.Client
				home string
			}
			var sessions []sess
			for i := range n {
				c := newClient(t, true)
				r := do(t, c, "GET", e.DP.URL()+"/")
				if r.status != 200 {
					t.Fatalf("new session %d: %d", i, r.status)
				}
				counts[r.instance]++
				if i%50 == 0 {
					sessions = append(sessions, sess{c, r.instance})
				}
			}
			if got := float64(counts["heavy"]) / n; math.Abs(got-0.7) > 0.05 {
				t.Errorf("initial split %v: heavy got %.1f%%, want 70%% ± 5", counts, 100*got)
			}
			for _, s := range sessions {
				for i := range 10 {
					if got := do(t, s.c, "GET", e.DP.URL()+"/").instance; got != s.home {
						t.Fatalf("sticky request %d on %q, want the session's %q (weights must not move it)", i, got, s.home)
					}
				}
			}
		})

		t.Run("routes /a and /b keep independent cookies", func(t *testing.T) {
			a := service("a", registry.AffinityCookie)
			a.Match = registry.Match{PathPrefix: "/a"}
			a.Cookie.Path = "/a" // Gateway API: the cookie path defaults to the rule's path prefix
			b := service("b", registry.AffinityCookie)
			b.Match = registry.Match{PathPrefix: "/b"}
			b.Cookie.Path = "/b"
			e := e2e.Start(t, kind, []registry.Service{a, b}, map[string][]e2e.Instance{
				"a": instances("a1", "a2"), "b": instances("b1", "b2"),
			})
			c := newClient(t, true)
			ra := do(t, c, "GET", e.DP.URL()+"/a/")
			rb := do(t, c, "GET", e.DP.URL()+"/b/")
			ca, cb := cookieNamed(ra.header, "tether-session"), cookieNamed(rb.header, "tether-session")
			if ca == nil || cb == nil || ca.Value == cb.Value || ca.Path != "/a" || cb.Path != "/b" {
				t.Fatalf("cookies %+v and %+v: want one per route, on its path", ca, cb)
			}
			for i := range 10 {
				if got := do(t, c, "GET", e.DP.URL()+"/a/x").instance; got != ra.instance {
					t.Fatalf("/a follow-up %d on %q, want %q", i, got, ra.instance)
				}
				if got := do(t, c, "GET", e.DP.URL()+"/b/x").instance; got != rb.instance {
					t.Fatalf("/b follow-up %d on %q, want %q", i, got, rb.instance)
				}
			}
			for _, req := range e.Upstream("a", ra.instance).Requests() {
				if strings.Contains(req.Header.Get("Cookie"), cb.Value) {
					t.Errorf("/a's instance received /b's session cookie: %q", req.Header.Get("Cookie"))
				}
			}
		})
	})
}

// cookieNamed returns the Set-Cookie named name, or nil.
func cookieNamed(h http.Header, name string) *http.Cookie {
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}
