package extproc

import (
	"sync/atomic"
	"time"
)

// mismatchLogEvery is how often at most the served-host warning is logged: a data plane that
// does not honour the destination would otherwise log one line per response. Every mismatch is
// still counted (Stats, tether_extproc_served_host_mismatches_total).
const mismatchLogEvery = 10 * time.Second

// logThrottle lets one event in each interval through and counts the ones it holds back. Safe
// for concurrent use; the zero value lets the first event through.
type logThrottle struct {
	next atomic.Int64 // Unix ns before which events are held back
	held atomic.Int64 // events held back since the last one let through
}

// allow reports whether the event at now may be logged, and how many were held back before it.
func (t *logThrottle) allow(now time.Time, every time.Duration) (bool, int64) {
	n := now.UnixNano()
	next := t.next.Load()
	if n < next || !t.next.CompareAndSwap(next, n+int64(every)) {
		t.held.Add(1)
		return false, 0
	}
	return true, t.held.Swap(0)
}
