package status

import (
	"context"
	"sync"
	"time"
)

// Default history: a sample every 10 s over the last 5 minutes (the dashboard's rate window),
// 31 samples per tether whatever its traffic.
const (
	DefaultHistoryStep   = 10 * time.Second
	DefaultHistoryWindow = 5 * time.Minute
)

// Sample is every service's cumulative decision counts by outcome at one time.
type Sample struct {
	Time time.Time `json:"time"`
	// Decisions: service → outcome (the ServiceStatus.decisions keys) → count since start.
	Decisions map[string]map[string]uint64 `json:"decisions"`
}

// History keeps a ring of Samples of an Outcomes, so that a page opened now has the last
// window's counts at once (the dashboard's chart and its rate() over 5 minutes). Its memory is
// bounded: window/step+1 samples, each the size of the Outcomes (services × outcomes). Safe
// for concurrent use.
type History struct {
	outcomes *Outcomes
	step     time.Duration
	now      func() time.Time

	mu   sync.Mutex
	ring []Sample // guarded by mu; oldest first, at most max
	max  int
}

// NewHistory samples o every step over window (0 for the defaults); now is the clock (nil:
// time.Now).
func NewHistory(o *Outcomes, window, step time.Duration, now func() time.Time) *History {
	if step <= 0 {
		step = DefaultHistoryStep
	}
	if window <= 0 {
		window = DefaultHistoryWindow
	}
	if now == nil {
		now = time.Now
	}
	return &History{outcomes: o, step: step, now: now, max: int(window/step) + 1}
}

// Step is the time between samples.
func (h *History) Step() time.Duration { return h.step }

// Record takes one sample now, dropping the oldest beyond the window.
func (h *History) Record() {
	s := Sample{Time: h.now(), Decisions: h.outcomes.All()}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) == h.max {
		copy(h.ring, h.ring[1:])
		h.ring = h.ring[:h.max-1]
	}
	h.ring = append(h.ring, s)
}

// Samples returns the recorded samples, oldest first, and one taken now (so that what
// happened since the last step is in it too). The result is the caller's; the maps in the
// recorded samples are shared and must not be changed.
func (h *History) Samples() []Sample {
	now := Sample{Time: h.now(), Decisions: h.outcomes.All()}
	h.mu.Lock()
	defer h.mu.Unlock()
	return append(append(make([]Sample, 0, len(h.ring)+1), h.ring...), now)
}

// Run records a sample at once and then every step until ctx ends.
func (h *History) Run(ctx context.Context) {
	t := time.NewTicker(h.step)
	defer t.Stop()
	for {
		h.Record()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
