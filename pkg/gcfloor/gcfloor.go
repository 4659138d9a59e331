package gcfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// The runtime/metrics samples a Floor reads after each cycle.
const (
	liveMetric    = "/gc/heap/live:bytes"
	stackMetric   = "/gc/scan/stack:bytes"
	globalsMetric = "/gc/scan/globals:bytes"
	// GoalMetric is the runtime's current heap goal (for callers that report it).
	GoalMetric = "/gc/heap/goal:bytes"
)

// maxPercent bounds the GC percentage a Floor sets (a tiny live heap with a large floor would
// ask for more; the floor is still met at any realistic size).
const maxPercent = 100_000

// Floor keeps the heap goal at or above a number of bytes. Its methods are safe for concurrent
// use.
type Floor struct {
	min  uint64
	base int // the GC percentage the runtime would use without the floor (GOGC)

	mu      sync.Mutex
	stopped bool
	prev    int // the GC percentage before Start, restored by Stop
	percent int // the percentage last set
	samples []metrics.Sample
}

// sentinel is the object whose collection tells a Floor that a cycle has ended. It holds a
// pointer so that it is never a tiny allocation (whose cleanup might never run).
type sentinel struct{ _ *int }

// Start installs a floor of min bytes on the heap goal, over a base GC percentage base (what
// GOGC would be, normally 100; at least 1). It sets the percentage for the current heap at once
// (from the last cycle's live heap; before any cycle, base) and again after every GC cycle
// until Stop. min 0 means no floor: Start sets base and returns.
func Start(min uint64, base int) *Floor {
	f := &Floor{min: min, base: max(base, 1), samples: []metrics.Sample{
		{Name: liveMetric}, {Name: stackMetric}, {Name: globalsMetric},
	}}
	f.prev = debug.SetGCPercent(f.base)
	f.percent = f.base
	if min == 0 {
		return f
	}
	f.mu.Lock()
	f.adjustLocked()
	f.mu.Unlock()
	f.arm()
	return f
}

// arm allocates a new sentinel whose cleanup, run after the cycle that finds it unreachable,
// adjusts the percentage and arms the next one.
func (f *Floor) arm() {
	runtime.AddCleanup(&sentinel{}, func(f *Floor) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stopped {
			return
		}
		f.adjustLocked()
		f.arm()
	}, f)
}

// adjustLocked sets the GC percentage that makes the next goal at least f.min for the live heap
// the last cycle marked.
func (f *Floor) adjustLocked() {
	metrics.Read(f.samples)
	live, roots := uint64(0), uint64(0)
	if s := f.samples[0]; s.Value.Kind() == metrics.KindUint64 {
		live = s.Value.Uint64()
	}
	for _, s := range f.samples[1:] {
		if s.Value.Kind() == metrics.KindUint64 {
			roots += s.Value.Uint64()
		}
	}
	p := Percent(f.min, live, roots, f.base)
	if p != f.percent {
		debug.SetGCPercent(p)
		f.percent = p
	}
}

// heapMinimum is the Go runtime's smallest heap goal at GOGC=100 (runtime.defaultHeapMinimum);
// the runtime scales it with the GC percentage.
const heapMinimum = 4 << 20

// Percent is the smallest GC percentage, at least base, whose heap goal reaches min. The
// runtime's goal is the larger of live + (live + roots) × percent/100 and its heap minimum,
// 4 MiB × percent/100, so that is the smaller of ceil((min − live) × 100 / (live + roots)) and
// ceil(min × 100 / 4 MiB), capped at 100,000. live is the heap the last cycle marked, roots the
// scannable stacks and globals. Before the first cycle (live 0) it is base: the runtime's first
// goal is its heap minimum.
func Percent(min, live, roots uint64, base int) int {
	if live == 0 || live >= min {
		return base
	}
	scan := float64(live + roots)
	byLive := math.Ceil(float64(min-live) * 100 / scan)
	byMinimum := math.Ceil(float64(min) * 100 / heapMinimum)
	return max(base, int(math.Min(math.Min(byLive, byMinimum), maxPercent)))
}

// Stop ends the floor and restores the GC percentage from before Start. It is idempotent.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.prev)
}

// Percentage is the GC percentage the floor set last.
func (f *Floor) Percentage() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent
}
