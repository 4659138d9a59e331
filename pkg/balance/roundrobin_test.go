package balance_test

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/balance"
)

func counts(n, picks int, pick func() (int, bool)) []int {
	c := make([]int, n)
	for range picks {
		if i, ok := pick(); ok {
			c[i]++
		}
	}
	return c
}

// within5 checks that counts split picks within ±5 % (absolute) of the weights' shares, the
// Gateway API conformance tolerance.
func within5(t *testing.T, weights []uint32, got []int) {
	t.Helper()
	var wsum, total float64
	for i, w := range weights {
		wsum += float64(w)
		total += float64(got[i])
	}
	for i, w := range weights {
		want, share := float64(w)/wsum, float64(got[i])/total
		if share < want-0.05 || share > want+0.05 {
			t.Errorf("instance %d: share %.3f, want %.3f ± 0.05 (counts %v)", i, share, want, got)
		}
	}
}

func TestRoundRobinWeightedSpread(t *testing.T) {
	for _, weights := range [][]uint32{{1, 1, 1}, {70, 30}, {5, 1, 1}, {1, 2, 3, 4}, {1000, 1}} {
		rr := balance.NewRoundRobin()
		got := counts(len(weights), 500, func() (int, bool) { return rr.Pick(weights, nil) })
		t.Logf("weights %v: 500 picks %v", weights, got)
		within5(t, weights, got)
	}
}

func TestRoundRobinIsSmooth(t *testing.T) {
	rr := balance.NewRoundRobin()
	weights := []uint32{5, 1, 1}
	var seq []int
	for range 14 {
		i, _ := rr.Pick(weights, nil)
		seq = append(seq, i)
	}
	// Smooth weighted round robin interleaves: every cycle of 7 has 5×0, 1×1, 1×2, and 0 never
	// runs more than 3 in a row.
	want := []int{0, 0, 1, 0, 2, 0, 0, 0, 0, 1, 0, 2, 0, 0}
	if diff := cmp.Diff(want, seq); diff != "" {
		t.Errorf("sequence (-want +got):\n%s", diff)
	}
}

func TestRoundRobinEqualWeightsRotate(t *testing.T) {
	rr := balance.NewRoundRobin()
	weights := []uint32{1, 1, 1, 1}
	for k := range 12 {
		if i, _ := rr.Pick(weights, nil); i != k%4 {
			t.Fatalf("pick %d = %d, want %d", k, i, k%4)
		}
	}
}

func TestRoundRobinSkipsUnusable(t *testing.T) {
	rr := balance.NewRoundRobin()
	weights := []uint32{2, 1, 1, 0}
	down := map[int]bool{1: true}
	usable := func(i int) bool { return !down[i] }
	got := counts(4, 300, func() (int, bool) { return rr.Pick(weights, usable) })
	if diff := cmp.Diff([]int{200, 0, 100, 0}, got); diff != "" {
		t.Errorf("counts with instance 1 down and 3 at weight 0 (-want +got):\n%s", diff)
	}
	down[1] = false
	got = counts(4, 400, func() (int, bool) { return rr.Pick(weights, usable) })
	if diff := cmp.Diff([]int{200, 100, 100, 0}, got); diff != "" {
		t.Errorf("counts after instance 1 recovers (-want +got):\n%s", diff)
	}
	if i, ok := rr.Pick(weights, func(int) bool { return false }); ok {
		t.Errorf("Pick with nothing usable = %d, true; want false", i)
	}
	if i, ok := rr.Pick(nil, nil); ok {
		t.Errorf("Pick with no instances = %d, true; want false", i)
	}
}

func TestRoundRobinConcurrent(t *testing.T) {
	rr := balance.NewRoundRobin()
	weights := []uint32{3, 2, 1}
	const goroutines, each = 8, 750 // 6000 picks = 1000 whole cycles of Σweight = 6
	var mu sync.Mutex
	total := make([]int, 3)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := counts(3, each, func() (int, bool) { return rr.Pick(weights, nil) })
			mu.Lock()
			for i, c := range local {
				total[i] += c
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if diff := cmp.Diff([]int{3000, 2000, 1000}, total); diff != "" {
		t.Errorf("concurrent picks (-want +got):\n%s", diff)
	}
}
