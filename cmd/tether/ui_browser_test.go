package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
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
// (a wrong token is refused with 401, a one-service token with 403, the "*" token works). The
// screenshot is kept in $TETHER_ARTIFACTS (default: the test's temp dir).
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
