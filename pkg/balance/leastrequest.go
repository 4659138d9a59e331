package balance

import (
	"math/rand/v2"
	"sync"
)

// fullScanMax is the largest instance count for which LeastRequest scans every instance; above
// it, LeastRequest samples two (power of two choices).
const fullScanMax = 64

// LeastRequest picks the instance with the fewest in-flight requests relative to its weight
// (inflight(i)/weight(i), compared exactly by cross-multiplication).
//
//   - Up to 64 instances it scans all of them: the pick is an exact minimum. Ties (e.g. at zero
//     load, when every score is 0) are broken by smooth weighted round robin over the tied
//     instances, so light traffic still spreads in proportion to the weights instead of piling
//     on index 0.
//   - Above 64 instances it uses power of two choices: two distinct usable instances are drawn
//     uniformly at random and the one with the lower score wins (ties: higher weight, then the
//     first drawn). This is O(1) per pick and keeps the maximum load within O(log log N) of the
//     mean; it is not weight-proportional at zero load.
//
// LeastRequest is safe for concurrent use. The in-flight counts are a snapshot: two concurrent
// picks may choose the same instance; admission (Slots.TryAcquireRequest) enforces hard caps.
type LeastRequest struct {
	mu   sync.Mutex
	ties RoundRobin // guarded by mu
}

// NewLeastRequest returns a LeastRequest with no history.
func NewLeastRequest() *LeastRequest { return &LeastRequest{} }

// Pick returns the index of the least loaded usable instance with weights[i] > 0 (a nil usable
// means all are usable); -1, false when none qualifies. inflight(i) must return instance i's
// in-flight requests (negative values count as 0). inflight and usable must not call back into
// the LeastRequest.
func (l *LeastRequest) Pick(weights []uint32, inflight func(int) int, usable func(int) bool) (int, bool) {
	if len(weights) > fullScanMax {
		if i, ok := l.pickTwo(weights, inflight, usable); ok {
			return i, true
		}
	}
	return l.pickScan(weights, inflight, usable)
}

// better reports whether instance a (load la, weight wa) scores strictly lower than b.
func better(la int, wa uint32, lb int, wb uint32) bool {
	return uint64(max(la, 0))*uint64(wb) < uint64(max(lb, 0))*uint64(wa)
}

// scanLoads records each candidate's load in loads (-1: not a candidate) and returns the
// candidate with the best score (-1 for none), its load and how many candidates there are.
func scanLoads(weights []uint32, inflight func(int) int, usable func(int) bool, loads []int) (best, bestLoad, n int) {
	best = -1
	for i, w := range weights {
		loads[i] = -1
		if w == 0 || (usable != nil && !usable(i)) {
			continue
		}
		ld := max(inflight(i), 0)
		loads[i] = ld
		n++
		if best < 0 || better(ld, w, bestLoad, weights[best]) {
			best, bestLoad = i, ld
		}
	}
	return best, bestLoad, n
}

func (l *LeastRequest) pickScan(weights []uint32, inflight func(int) int, usable func(int) bool) (int, bool) {
	// First pass: the best score, and each candidate's load (-1 = not a candidate) so the tie
	// set is judged on the same snapshot.
	var buf [fullScanMax]int
	var loads []int
	if len(weights) <= fullScanMax {
		loads = buf[:len(weights)]
	} else {
		loads = make([]int, len(weights)) // fallback scan for large N only
	}
	best, bestLoad, n := scanLoads(weights, inflight, usable, loads)
	if best < 0 {
		return -1, false
	}
	if n == 1 {
		return best, true
	}
	bw := weights[best]
	tied := func(i int) bool {
		return loads[i] >= 0 && !better(loads[i], weights[i], bestLoad, bw) && !better(bestLoad, bw, loads[i], weights[i])
	}
	ties := 0
	for i := range loads {
		if tied(i) {
			ties++
		}
	}
	if ties == 1 {
		return best, true
	}
	l.mu.Lock()
	i, ok := l.ties.Pick(weights, tied)
	l.mu.Unlock()
	if !ok {
		return best, true
	}
	return i, true
}

func (l *LeastRequest) pickTwo(weights []uint32, inflight func(int) int, usable func(int) bool) (int, bool) {
	ok := func(i int) bool { return weights[i] > 0 && (usable == nil || usable(i)) }
	n := len(weights)
	// A few random draws find usable instances quickly unless most are unusable; then the
	// caller falls back to a full scan.
	a, b := -1, -1
	for range 8 {
		i := rand.IntN(n)
		if !ok(i) || i == a {
			continue
		}
		if a < 0 {
			a = i
			continue
		}
		b = i
		break
	}
	if b < 0 {
		return -1, false
	}
	la, lb := inflight(a), inflight(b)
	switch {
	case better(lb, weights[b], la, weights[a]):
		return b, true
	case better(la, weights[a], lb, weights[b]):
		return a, true
	case weights[b] > weights[a]:
		return b, true
	default:
		return a, true
	}
}
