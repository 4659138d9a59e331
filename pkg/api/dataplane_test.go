package api_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestPrePlacedSessionsThroughTheDataPlane creates sessions through the API (both transports)
// and sends requests carrying their ids through the ext_proc path (tether's ext_proc and xDS
// servers with the Envoy-faithful harness, or a real Envoy when ENVOY_BIN is set) to real
// upstreams: each lands on its pre-placed instance. After a delete, the same id starts a new
// session.
func TestPrePlacedSessionsThroughTheDataPlane(t *testing.T) {
	for _, kind := range e2e.Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			web, hdr := affinitytest.Service("web", registry.AffinityCookie), affinitytest.Service("hdr", registry.AffinityHeader)
			web.Match.PathPrefix, hdr.Match.PathPrefix = "/web", "/hdr"
			// One session per instance, so three pre-placed sessions use all three instances.
			web.SessionsPerInstance, hdr.SessionsPerInstance = 1, 1
			svcs := []registry.Service{web, hdr}
			ins := []e2e.Instance{{ID: "i1"}, {ID: "i2"}, {ID: "i3"}}
			env := e2e.Start(t, kind, svcs, map[string][]e2e.Instance{"web": ins, "hdr": ins})
			env.WaitEndpoints(t)
			srv := apitest.Serve(t, env.Fixture)
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
			send := func(path string, hdr ...string) (instance string, h http.Header) {
				t.Helper()
				req, err := http.NewRequest("GET", env.DP.URL()+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i+1 < len(hdr); i += 2 {
					req.Header.Add(hdr[i], hdr[i+1])
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("request %s %v: %d %s", path, hdr, resp.StatusCode, body)
				}
				return resp.Header.Get(upstream.InstanceHeader), resp.Header
			}
			ctx := context.Background()

			for _, tr := range transports {
				c := tr.new(t, srv, "")
				placed := map[string]string{}
				for range 3 {
					s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web"})
					if err != nil {
						t.Fatalf("%s: create web: %v", tr.name, err)
					}
					placed[s.GetId()] = s.GetInstance()
					h, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: tr.name + "-" + s.GetId()[:8]})
					if err != nil {
						t.Fatalf("%s: create hdr: %v", tr.name, err)
					}
					if h.GetInstance() != s.GetInstance() {
						t.Fatalf("placement differs between services: %s vs %s", h.GetInstance(), s.GetInstance())
					}
				}
				spread := map[string]bool{}
				for id, inst := range placed {
					spread[inst] = true
					for range 5 {
						if got, _ := send("/web/", "Cookie", "tether-session="+id); got != inst {
							t.Errorf("%s: cookie session %s answered by %q, want pre-placed %q", tr.name, id, got, inst)
						}
						if got, _ := send("/hdr/", "X-Tether-Session", tr.name+"-"+id[:8]); got != inst {
							t.Errorf("%s: header session %s answered by %q, want pre-placed %q", tr.name, tr.name+"-"+id[:8], got, inst)
						}
					}
				}
				if len(spread) != 3 {
					t.Errorf("%s: sessions on %v, want all three instances", tr.name, placed)
				}

				// Delete one; the next request with its id starts a new session.
				var id string
				for id = range placed {
					break
				}
				before, err := c.GetSession(ctx, "web", id)
				if err != nil {
					t.Fatal(err)
				}
				env.Fixture.Clock.Advance(time.Second)
				if err := c.DeleteSession(ctx, "web", id); err != nil {
					t.Fatalf("%s: delete: %v", tr.name, err)
				}
				inst, h := send("/web/", "Cookie", "tether-session="+id)
				if inst != placed[id] {
					t.Errorf("%s: the new session went to %q, want %q (the only instance with a free session slot)", tr.name, inst, placed[id])
				}
				if (&http.Response{Header: h}).Cookies() == nil {
					t.Errorf("%s: the request after delete got no Set-Cookie: not a new session", tr.name)
				}
				after, err := c.GetSession(ctx, "web", id)
				if err != nil {
					t.Fatal(err)
				}
				if after.GetStatus() != tetherv1.SessionStatus_SESSION_STATUS_ACTIVE || !after.GetCreateTime().AsTime().After(before.GetCreateTime().AsTime()) {
					t.Errorf("%s: after delete and a request: %v; want a new Active session", tr.name, after)
				}
				// Clean up for the next transport.
				for _, svc := range []string{"web", "hdr"} {
					list, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: svc, Status: tetherv1.SessionStatus_SESSION_STATUS_ACTIVE})
					if err != nil {
						t.Fatal(err)
					}
					for _, s := range list.GetSessions() {
						if err := c.DeleteSession(ctx, svc, s.GetId()); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			env.WaitSlotsReleased(t)
		})
	}
}
