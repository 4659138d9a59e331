package balance

import (
	"fmt"
	"math/big"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// referencePopulate is the populate loop written as plainly as possible: at each step the
// instance with the smallest (count+1)/weight (exact rationals; ties by id) claims its next free
// preferred entry. NewMaglev's fast paths must produce exactly this table.
func referencePopulate(ids []string, weights []uint32, m int) []uint16 {
	n := len(ids)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if ids[a] < ids[b] {
			return -1
		}
		return 1
	})
	next, skip, count := make([]uint64, n), make([]uint64, n), make([]int64, n)
	for i := range ids {
		next[i], skip[i] = permutation(ids[i], uint64(m))
	}
	w := func(i int) int64 {
		if weights == nil {
			return 1
		}
		return int64(weights[i])
	}
	table := make([]uint16, m)
	taken := make([]bool, m)
	for range m {
		best := -1
		for _, i := range order {
			if best < 0 || big.NewRat(count[i]+1, w(i)).Cmp(big.NewRat(count[best]+1, w(best))) < 0 {
				best = i
			}
		}
		for taken[next[best]] {
			next[best] = (next[best] + skip[best]) % uint64(m)
		}
		taken[next[best]] = true
		table[next[best]] = uint16(best)
		count[best]++
	}
	return table
}

func TestPopulateMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		n       int
		weights []uint32
		m       int
	}{
		{5, nil, 1009},
		{7, []uint32{3, 3, 3, 3, 3, 3, 3}, 1013},
		{4, []uint32{2, 1, 1, 1}, 1009},
		{6, []uint32{1, 2, 3, 4, 5, 6}, 2003},
		{5, []uint32{1000, 1, 7, 999, 1}, 4001},
		{3, []uint32{4, 2, 6}, 101}, // equal fractions: 2/4 = 1/2 = 3/6
	} {
		t.Run(fmt.Sprint(tc.weights, tc.n, tc.m), func(t *testing.T) {
			ids := make([]string, tc.n)
			for i := range ids {
				ids[tc.n-1-i] = fmt.Sprintf("instance-%d", i) // reverse of sorted order
			}
			mg, err := NewMaglev(ids, tc.weights, WithTableSize(tc.m))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(referencePopulate(ids, tc.weights, tc.m), mg.table); diff != "" {
				t.Errorf("table differs from the reference populate (-want +got):\n%.3000s", diff)
			}
		})
	}
}
