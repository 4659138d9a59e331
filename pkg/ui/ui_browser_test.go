package ui_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/api/apitest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
	"github.com/tether-dev/tether/pkg/ui"
)

// requireTool skips t when path is missing, or fails it under make test (CI set).
func requireTool(t *testing.T, path, why string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if testing.Short() || os.Getenv("CI") == "" && os.Getenv("TETHER_REQUIRE_BROWSER") == "" {
			t.Skipf("%s missing (%s): run make deps", path, why)
		}
		t.Fatalf("%s missing (%s): run make deps", path, why)
	}
}

// TestOnePointChartShowsItsPoint: a chart whose lines have one point each (a fresh tether, or a
// page opened within a history step of the last sample) still shows each point, in Debian's
// Chromium through playwright-core (web/chart-test.mjs), judged by the pixels drawn.
//
// The history holds two samples 5 s apart (0, then 3 NoCapacity and 1 TooManyRequests), so each
// line has exactly one point: 503 at 0.6/s, the chart's top, and 429 at 0.2/s, lower. The clock
// of the history and of the snapshots stands still, so the stream's snapshots add no sample and
// the chart keeps its one point however slowly the page loads.
func TestOnePointChartShowsItsPoint(t *testing.T) {
	requireTool(t, "/usr/bin/chromium", "Debian package chromium")
	requireTool(t, "web/node_modules/playwright-core", "npm ci in pkg/ui/web")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found")
	}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	fx := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, affinitytest.Instances("web", 2))
	o := status.NewOutcomes()
	h := status.NewHistory(o, 0, 0, clock)
	h.Record()
	mu.Lock()
	now = now.Add(5 * time.Second)
	mu.Unlock()
	for range 3 {
		o.Add("web", "NoCapacity")
	}
	o.Add("web", "TooManyRequests")
	a := status.New(fx.Registry, fx.Engine, status.WithOutcomes(o), status.WithClock(clock))
	srv := apitest.Serve(t, fx, apitest.WithAPIOptions(api.WithStatus(a.Snapshot, time.Second),
		api.WithStatusHistory(h), api.WithUI(ui.Handler())))

	dir := os.Getenv("TETHER_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	shot, err := filepath.Abs(filepath.Join(dir, "chart-one-point.png"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "chart-test.mjs")
	cmd.Dir = "web"
	cmd.Env = append(os.Environ(), "URL="+srv.URL, "SCREENSHOT="+shot)
	out, err := cmd.CombinedOutput()
	t.Logf("browser test:\n%s", out)
	if err != nil {
		t.Fatalf("browser test failed: %v", err)
	}
	t.Logf("chart: %s", shot)
}
