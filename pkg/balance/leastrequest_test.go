package balance_test

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/balance"
)

func TestLeastRequestFillsByWeight(t *testing.T) {
	// Picks that never finish: the exact minimum of inflight/weight fills instances in
	// proportion to their weights.
	weights := []uint32{1, 2, 3}
	lr := balance.NewLeastRequest()
	inflight := make([]int, 3)
	for range 600 {
		i, ok := lr.Pick(weights, func(i int) int { return inflight[i] }, nil)
		if !ok {
			t.Fatal("Pick failed")
		}
		inflight[i]++
	}
	if diff := cmp.Diff([]int{100, 200, 300}, inflight); diff != "" {
		t.Errorf("in flight after 600 held picks (-want +got):\n%s", diff)
	}
}

func TestLeastRequestPrefersLeastLoaded(t *testing.T) {
	lr := balance.NewLeastRequest()
	weights := []uint32{1, 1, 4, 1}
	inflight := []int{3, 1, 5, 2} // scores 3, 1, 1.25, 2
	for range 10 {
		if i, _ := lr.Pick(weights, func(i int) int { return inflight[i] }, nil); i != 1 {
			t.Fatalf("Pick = %d, want 1", i)
		}
	}
	down := func(i int) bool { return i != 1 }
	if i, _ := lr.Pick(weights, func(i int) int { return inflight[i] }, down); i != 2 {
		t.Fatalf("Pick with instance 1 down = %d, want 2 (5/4 beats 2/1)", i)
	}
	if i, ok := lr.Pick(weights, func(i int) int { return inflight[i] }, func(int) bool { return false }); ok {
		t.Fatalf("Pick with nothing usable = %d, true; want false", i)
	}
}

func TestLeastRequestIdleTiesFollowWeights(t *testing.T) {
	lr := balance.NewLeastRequest()
	weights := []uint32{1, 3}
	got := counts(2, 400, func() (int, bool) { return lr.Pick(weights, func(int) int { return 0 }, nil) })
	if diff := cmp.Diff([]int{100, 300}, got); diff != "" {
		t.Errorf("idle picks (-want +got):\n%s", diff)
	}
}

func TestLeastRequestPowerOfTwoChoices(t *testing.T) {
	const n = 200 // above the full-scan limit
	weights := make([]uint32, n)
	for i := range weights {
		weights[i] = 1
	}
	lr := balance.NewLeastRequest()
	inflight := make([]int, n)
	for range 20 * n {
		i, ok := lr.Pick(weights, func(i int) int { return inflight[i] }, func(i int) bool { return i%10 != 0 })
		if !ok {
			t.Fatal("Pick failed")
		}
		if i%10 == 0 {
			t.Fatalf("picked unusable instance %d", i)
		}
		inflight[i]++
	}
	lo, hi := inflight[1], inflight[1]
	for i, c := range inflight {
		if i%10 == 0 {
			continue
		}
		lo, hi = min(lo, c), max(hi, c)
	}
	t.Logf("power of two choices, 4000 held picks over 180 usable instances: min %d max %d (mean 22.2)", lo, hi)
	if hi-lo > 8 {
		t.Errorf("spread max-min = %d, want ≤ 8 for power of two choices", hi-lo)
	}
	// With almost everything unusable the random draws fail and the full scan still finds it.
	if i, ok := lr.Pick(weights, func(i int) int { return 0 }, func(i int) bool { return i == 137 }); !ok || i != 137 {
		t.Errorf("Pick with only 137 usable = %d, %v", i, ok)
	}
}

func TestLeastRequestConcurrent(t *testing.T) {
	weights := []uint32{1, 2, 1, 4, 2}
	var inflight [5]atomic.Int64
	var unusable atomic.Int64
	unusable.Store(-1)
	lr := balance.NewLeastRequest()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for k := range 2000 {
				if g == 0 && k%100 == 0 {
					unusable.Store(int64(r.IntN(5)))
				}
				bad := int(unusable.Load())
				i, ok := lr.Pick(weights, func(i int) int { return int(inflight[i].Load()) }, func(i int) bool { return i != bad })
				if !ok {
					t.Error("Pick failed")
					return
				}
				if i == bad {
					t.Errorf("picked unusable instance %d", i)
				}
				inflight[i].Add(1)
				if r.IntN(3) == 0 {
					inflight[i].Add(-1)
				} else {
					defer inflight[i].Add(-1)
				}
			}
		}()
	}
	wg.Wait()
	for i := range inflight {
		if v := inflight[i].Load(); v != 0 {
			t.Errorf("instance %d in flight %d after all finished", i, v)
		}
	}
}
