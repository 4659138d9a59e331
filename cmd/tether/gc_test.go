package main

import (
	"context"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/gcfloor"
)

func TestPlanGC(t *testing.T) {
	for _, tc := range []struct {
		name string
		mib  int
		gogc string
		want gcPlan
	}{
		{"default floor", config.DefaultGCHeapFloorMiB, "", gcPlan{floorMiB: config.DefaultGCHeapFloorMiB}},
		{"floor off", 0, "", gcPlan{}},
		{"GOGC set", 64, "200", gcPlan{gogc: "200"}},
		{"GOGC off", 64, "off", gcPlan{gogc: "off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"GOGC": tc.gogc}
			if got := planGC(config.Runtime{GCHeapFloorMiB: tc.mib}, func(k string) string { return env[k] }); got != tc.want {
				t.Errorf("planGC = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func gcMetric(t *testing.T, name string) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestServeGCFloor runs tether serve (the command) and reads the Go runtime's own pacing:
// the config's runtime.gcHeapFloorMiB (default 32) raises the heap goal to it; a GOGC in the environment
// or a floor of 0 leaves the runtime's GC percentage as it was; serve restores it on exit.
func TestServeGCFloor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		runtime string // config line
		gogc    string
		floor   int // MiB, 0: none applied
		log     string
	}{
		{"default", "", "", config.DefaultGCHeapFloorMiB, `msg="gc: heap goal floor" floorMiB=32`},
		// A floor far above this test process's live heap: only the floor makes such a goal.
		{"configured", "runtime: {gcHeapFloorMiB: 1024}\n", "", 1024, `msg="gc: heap goal floor" floorMiB=1024`},
		{"GOGC overrides", "", "400", 0, `msg="gc: GOGC is set; runtime.gcHeapFloorMiB not applied" GOGC=400`},
		{"off", "runtime: {gcHeapFloorMiB: 0}\n", "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc) // read by planGC; the runtime read its own at start
			before := gcMetric(t, "/gc/gogc:percent")
			path := filepath.Join(t.TempDir(), "tether.yaml")
			writeFile(t, path, tc.runtime+testConfig(upstreamPort(t)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stdout, stderr testutil.SyncBuffer
			code := make(chan int, 1)
			go func() { code <- run(ctx, []string{"serve", "-c", path}, &stdout, &stderr) }()
			waitFor(t, "serving log line", func() bool { return strings.Contains(stderr.String(), `msg="tether serving"`) },
				stderr.String)
			if tc.log != "" && !strings.Contains(stderr.String(), tc.log) {
				t.Errorf("log has no %q:\n%s", tc.log, stderr.String())
			}
			if tc.floor > 0 {
				floor := uint64(tc.floor) << 20
				waitFor(t, "the heap goal to reach the floor", func() bool {
					runtime.GC()
					return gcMetric(t, gcfloor.GoalMetric) >= floor
				})
				// The percentage rises only where the GOGC goal is below the floor.
				if got := gcMetric(t, "/gc/gogc:percent"); tc.floor == 1024 && got <= before {
					t.Errorf("GC percentage %d with the floor, want above %d", got, before)
				}
			} else if got := gcMetric(t, "/gc/gogc:percent"); got != before {
				t.Errorf("GC percentage %d, want the runtime's %d untouched", got, before)
			}
			cancel()
			select {
			case c := <-code:
				if c != 0 {
					t.Fatalf("exit code %d\n%s", c, stderr.String())
				}
			case <-time.After(15 * time.Second):
				t.Fatal("serve did not stop")
			}
			if got := gcMetric(t, "/gc/gogc:percent"); got != before {
				t.Errorf("GC percentage %d after serve, want %d restored", got, before)
			}
		})
	}
}
