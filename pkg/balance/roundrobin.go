package balance

import "sync"

// RoundRobin picks instances in smooth weighted round robin order (the interleaving nginx uses):
// over any run of picks with a fixed set of usable instances and weights, instance i is picked
// weight(i)/Σweight of the time, spread evenly rather than in bursts (weights 5,1,1 give
// a a b a c a a, not a a a a a b c). It is deterministic: the same sequence of calls yields the
// same picks.
//
// RoundRobin is safe for concurrent use; Pick holds a mutex for O(N) work. Instance indices must
// keep their meaning between calls; when the number of weights changes the per-instance state is
// reset (the spread is then exact again from that call on).
type RoundRobin struct {
	mu      sync.Mutex
	current []int64
}

// NewRoundRobin returns a RoundRobin with no history.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

// Pick returns the next instance index among those with weights[i] > 0 and usable(i) (a nil
// usable means all are usable). It returns -1, false when none qualifies. usable is called with
// the RoundRobin's lock held and must not call back into it.
//
// Unusable instances keep their position: they neither accumulate nor lose credit while skipped,
// so when one becomes usable again it rejoins the rotation without a burst.
func (r *RoundRobin) Pick(weights []uint32, usable func(int) bool) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.current) != len(weights) {
		r.current = make([]int64, len(weights))
	}
	best := -1
	var total int64
	for i, w := range weights {
		if w == 0 || (usable != nil && !usable(i)) {
			continue
		}
		r.current[i] += int64(w)
		total += int64(w)
		if best < 0 || r.current[i] > r.current[best] {
			best = i
		}
	}
	if best < 0 {
		return -1, false
	}
	r.current[best] -= total
	return best, true
}
