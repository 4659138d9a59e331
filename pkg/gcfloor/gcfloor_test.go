package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name             string
		min, live, roots uint64
		base, want       int
	}{
		{"no floor", 0, 3 * mib, mib, 100, 100},
		{"live above the floor", 32 * mib, 40 * mib, mib, 100, 100},
		{"goal already above the floor", 32 * mib, 20 * mib, mib, 100, 100},
		// 3 MiB live, 1 MiB roots: (32-3)*100/4 = 725.
		{"small heap", 32 * mib, 3 * mib, mib, 100, 725},
		// 1 MiB live: the heap minimum, 4 MiB × 800/100, reaches 32 MiB first.
		{"heap minimum first", 32 * mib, mib, mib / 2, 100, 800},
		{"rounds up", 10 * mib, 3 * mib, 6 * mib, 1, 78},
		{"base above the floor's need", 32 * mib, 3 * mib, mib, 1000, 1000},
		{"capped", 1 << 50, 1, 0, 100, maxPercent},
		{"no cycle yet", 32 * mib, 0, mib, 100, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.min, tc.live, tc.roots, tc.base); got != tc.want {
				t.Errorf("Percent(%d, %d, %d, %d) = %d, want %d", tc.min, tc.live, tc.roots, tc.base, got, tc.want)
			}
		})
	}
}

func readUint(t *testing.T, name string) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("metric %s unsupported", name)
	}
	return s[0].Value.Uint64()
}

// waitGC runs GC cycles until cond holds (each cycle ends with the floor's cleanup, run on
// another goroutine) and fails after 10 s.
func waitGC(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// TestFloorFollowsTheLiveHeap starts a floor far above this test's live heap: the runtime's
// heap goal reaches it; with a live heap above the floor the percentage returns to the base
// (the runtime's own pacing); Stop restores the percentage from before.
func TestFloorFollowsTheLiveHeap(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	const floor = 64 << 20
	runtime.GC() // a measured live heap, so Start sets the floor's percentage at once
	f := Start(floor, 100)
	defer f.Stop()
	if p := f.Percentage(); p <= 100 {
		t.Fatalf("percentage at start %d, want > 100 for a %d B floor over a small heap", p, floor)
	}
	waitGC(t, "the heap goal to reach the floor", func() bool { return readUint(t, GoalMetric) >= floor })
	if got := readUint(t, "/gc/gogc:percent"); got != uint64(f.Percentage()) {
		t.Errorf("runtime GOGC %d, floor's %d", got, f.Percentage())
	}

	// Hold 96 MiB live (pointers, so the GC marks it): above the floor, the base applies.
	live := make([][]*int, 96)
	for i := range live {
		live[i] = make([]*int, (1<<20)/8)
	}
	waitGC(t, "the percentage to return to the base", func() bool { return f.Percentage() == 100 })
	if got := readUint(t, "/gc/gogc:percent"); got != 100 {
		t.Errorf("runtime GOGC %d with the live heap above the floor, want 100", got)
	}
	runtime.KeepAlive(live)

	// Once the heap is small again, the floor raises the percentage again (the cleanup re-arms
	// after every cycle).
	waitGC(t, "the floor to apply again", func() bool { return f.Percentage() > 100 })

	f.Stop()
	f.Stop()
	if got := readUint(t, "/gc/gogc:percent"); got != 100 {
		t.Errorf("GC percentage after Stop %d, want the 100 from before Start", got)
	}
	p := f.Percentage()
	runtime.GC()
	runtime.GC()
	if got := readUint(t, "/gc/gogc:percent"); got != 100 {
		t.Errorf("runtime GOGC %d after Stop and two cycles, want 100 (the floor keeps adjusting)", got)
	}
	if f.Percentage() != p {
		t.Errorf("the floor adjusted after Stop")
	}
}

func TestZeroFloorSetsTheBase(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	f := Start(0, 150)
	if got := readUint(t, "/gc/gogc:percent"); got != 150 {
		t.Errorf("runtime GOGC %d, want the base 150", got)
	}
	f.Stop()
	if got := readUint(t, "/gc/gogc:percent"); got != 100 {
		t.Errorf("runtime GOGC %d after Stop, want 100", got)
	}
}
