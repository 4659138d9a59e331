package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

// browserTool finds what the browser test needs; under make test (CI=true) a missing one fails.
func browserTool(t *testing.T, path, why string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if testing.Short() || os.Getenv("CI") == "" && os.Getenv("TETHER_REQUIRE_BROWSER") == "" {
			t.Skipf("%s missing (%s): run make deps", path, why)
		}
		t.Fatalf("%s missing (%s): run make deps", path, why)
	}
}

// TestDashboardInBrowser drives the dashboard in Debian's headless Chromium through
// playwright-core (pkg/ui/web/browser-test.mjs) against two real tethers with real sessions:
// one on loopback without tokens (the page loads with no console errors and nothing from
// another origin, the slots shown are the API's, a session created through the API shows
// within 2 s, search by id, drain with a confirmation changes the state) and one with tokens
// (a wrong token is refused with 401, a one-service token with 403, the "*" token works), and
// a third with traffic through the Envoy-faithful harness (sessions on both actives and on the
// standby, a 503 NoCapacity) for what must be live: the sessions table follows the stream, the
// 429/503 legend is the 5-minute rate of the counters, a fresh page charts history at once,
// buttons fit the state, times carry date and zone, and "actual" counts the standby holding
// sessions. The screenshots are kept in $TETHER_ARTIFACTS (default: the test's temp dir).
func TestDashboardInBrowser(t *testing.T) {
	browserTool(t, "/usr/bin/chromium", "Debian package chromium")
	browserTool(t, "../../pkg/ui/web/node_modules/playwright-core", "npm ci in pkg/ui/web")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found")
	}
	open := startServe(t, testConfig(upstreamPort(t), upstreamPort(t), upstreamPort(t)))
	auth := startServe(t, withTokens(testConfig(upstreamPort(t), upstreamPort(t))))
	c, err := client.New(open.apiAddr)
	if err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)
	for range 4 {
		if err := c.Call(context.Background(), "POST", "/v1/services/web/sessions", &tetherv1.CreateSessionRequest{}, &tetherv1.Session{}); err != nil {
			t.Fatal(err)
		}
	}
	scene := startServe(t, sceneConfig(upstreamPort(t), upstreamPort(t), upstreamPort(t)))
	noCapacity := sceneTraffic(t, scene)
	dir := os.Getenv("TETHER_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	shot, err := filepath.Abs(filepath.Join(dir, "dashboard.png"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "browser-test.mjs")
	cmd.Dir = "../../pkg/ui/web"
	cmd.Env = append(os.Environ(), "OPEN_URL=http://"+open.apiAddr, "AUTH_URL=http://"+auth.apiAddr,
		"SCENE_URL=http://"+scene.apiAddr, fmt.Sprintf("SCENE_NOCAPACITY=%d", noCapacity),
		"SCENE_SCREENSHOT="+filepath.Join(dir, "dashboard-scene.png"),
		"STAR_TOKEN="+starToken, "WEB_TOKEN="+webToken, "SCREENSHOT="+shot)
	out, err := cmd.CombinedOutput()
	t.Logf("browser test:\n%s", out)
	if err != nil {
		t.Fatalf("browser test failed: %v", err)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() == 0 {
		t.Fatalf("no screenshot at %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)
}

// sceneConfig is one cookie service of two sessions per instance on i0, i1 and the standby i2.
func sceneConfig(ports ...int) string {
	return fmt.Sprintf(`apiVersion: tether/v1
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: 127.0.0.1:0}
registry: {allowedNetworks: [127.0.0.1/32]}
newSessions: {provisionalIdleTimeout: 5m}
services:
- name: web
  affinity: cookie
  sessionsPerInstance: 2
  instances:
  - {id: i0, address: 127.0.0.1, ports: {http: %d}}
  - {id: i1, address: 127.0.0.1, ports: {http: %d}}
  - {id: i2, address: 127.0.0.1, ports: {http: %d}, state: standby}
`, ports[0], ports[1], ports[2])
}

// sceneTraffic sends requests through the harness (standing in for Envoy) to the scene's
// tether: six clients fill i0 and i1 and then, by scale-out, the standby i2, and come back
// with their cookies; then new clients are refused 503 NoCapacity. It returns how many were.
func sceneTraffic(t *testing.T, info serveInfo) int {
	t.Helper()
	var eps []envoyharness.Endpoint
	for _, in := range info.registry.Snapshot().Instances("web") {
		ep := envoyharness.Endpoint{Address: in.HTTPAddr(), Healthy: true}
		if in.State != registry.StateActive {
			ep.Priority = 1
		}
		eps = append(eps, ep)
	}
	h, err := envoyharness.New(info.extProcAddr,
		envoyharness.EndpointsFunc(func(string) []envoyharness.Endpoint { return eps }),
		[]envoyharness.VirtualHost{{Name: "web", Domains: []string{"*"},
			Routes: []envoyharness.Route{{Name: "web", PathPrefix: "/", Cluster: "web", Service: "web"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	get := func(c *http.Client) int {
		resp, err := c.Get(h.URL() + "/")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	var clients []*http.Client
	for range 6 {
		jar, err := cookiejar.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Jar: jar}
		if code := get(c); code != http.StatusOK {
			t.Fatalf("new session %d: %d", len(clients), code)
		}
		clients = append(clients, c)
	}
	for i, c := range clients {
		if code := get(c); code != http.StatusOK {
			t.Fatalf("client %d back: %d", i, code)
		}
	}
	const refused = 10
	for range refused {
		if code := get(http.DefaultClient); code != http.StatusServiceUnavailable {
			t.Fatalf("a seventh session: %d, want 503", code)
		}
	}
	return refused
}
