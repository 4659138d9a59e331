package balance_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tether-dev/tether/pkg/balance"
)

func BenchmarkMaglevBuild(b *testing.B) {
	for _, tc := range []struct {
		name     string
		n, m     int
		weighted bool
	}{
		{"N=10", 10, 0, false},
		{"N=100", 100, 0, false},
		{"N=1000", 1000, 0, false},
		{"N=1000/weighted", 1000, 0, true},
		{"N=1000/M=65537", 1000, 65537, false}, // the paper's and Envoy's default size, baseline
	} {
		b.Run(tc.name, func(b *testing.B) {
			all := ids(tc.n)
			var w []uint32
			if tc.weighted {
				w = make([]uint32, tc.n)
				for i := range w {
					w[i] = uint32(1 + i%4)
				}
			}
			for b.Loop() {
				if _, err := balance.NewMaglev(all, w, balance.WithTableSize(tc.m)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMaglevLookup(b *testing.B) {
	ks := keys(1 << 16)
	for _, n := range []int{10, 1000} {
		m := mustMaglev(b, ids(n), nil)
		b.Run(fmt.Sprintf("N=%d/all-usable", n), func(b *testing.B) {
			var sink int
			k := 0
			for b.Loop() {
				i, _ := m.Lookup(ks[k&(len(ks)-1)], nil)
				sink += i
				k++
			}
			_ = sink
		})
		down := n / 3
		usable := func(i int) bool { return i != down }
		b.Run(fmt.Sprintf("N=%d/one-down", n), func(b *testing.B) {
			var sink int
			k := 0
			for b.Loop() {
				i, _ := m.Lookup(ks[k&(len(ks)-1)], usable)
				sink += i
				k++
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("N=%d/baseline-modulo", n), func(b *testing.B) {
			var sink int
			k := 0
			for b.Loop() {
				sink += int(ks[k&(len(ks)-1)] % uint64(n))
				k++
			}
			_ = sink
		})
	}
}

func BenchmarkLookupBounded(b *testing.B) {
	ks := keys(1 << 16)
	for _, n := range []int{10, 100, 1000} {
		m := mustMaglev(b, ids(n), nil)
		loads := make([]atomic.Int64, n)
		for i := range loads {
			loads[i].Store(int64(100 + i%7))
		}
		load := func(i int) int { return int(loads[i].Load()) }
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			var sink int
			k := 0
			for b.Loop() {
				i, _ := m.LookupBounded(ks[k&(len(ks)-1)], nil, load, 1.25)
				sink += i
				k++
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("N=%d/caller-total", n), func(b *testing.B) {
			limit := balance.BoundedLoadCap(103*n, n, 1.25)
			var sink int
			k := 0
			for b.Loop() {
				i, _ := m.LookupBoundedCap(ks[k&(len(ks)-1)], nil, load, limit)
				sink += i
				k++
			}
			_ = sink
		})
	}
}

func BenchmarkRoundRobin(b *testing.B) {
	weights := []uint32{3, 1, 2, 1, 1, 5, 1, 1, 2, 1}
	b.Run("N=10", func(b *testing.B) {
		rr := balance.NewRoundRobin()
		for b.Loop() {
			rr.Pick(weights, nil)
		}
	})
	b.Run("N=10/parallel", func(b *testing.B) {
		rr := balance.NewRoundRobin()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rr.Pick(weights, nil)
			}
		})
	})
	b.Run("N=10/baseline-atomic-counter/parallel", func(b *testing.B) {
		var c atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = c.Add(1) % uint64(len(weights))
			}
		})
	})
}

func BenchmarkLeastRequest(b *testing.B) {
	for _, n := range []int{10, 100} { // full scan; power of two choices
		weights := make([]uint32, n)
		loads := make([]atomic.Int64, n)
		for i := range weights {
			weights[i] = uint32(1 + i%3)
			loads[i].Store(int64(i % 5))
		}
		lr := balance.NewLeastRequest()
		inflight := func(i int) int { return int(loads[i].Load()) }
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for b.Loop() {
				lr.Pick(weights, inflight, nil)
			}
		})
	}
}

func BenchmarkSlotsAcquireRelease(b *testing.B) {
	b.Run("parallel", func(b *testing.B) {
		s := balance.NewSlots(1, 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tk, ok := s.TryAcquireRequest(context.Background())
				if !ok {
					b.Error("refused")
					return
				}
				tk.Release()
			}
		})
	})
	b.Run("parallel/at-cap", func(b *testing.B) { // contended: most attempts are refused
		s := balance.NewSlots(1, 2)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if tk, ok := s.TryAcquireRequest(context.Background()); ok {
					tk.Release()
				}
			}
		})
	})
	b.Run("baseline-atomic-add-pair/parallel", func(b *testing.B) {
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n.Add(1)
				n.Add(-1)
			}
		})
	})
}

func BenchmarkHash(b *testing.B) {
	key := "a84f1c2e9b7d4e3f@10.0.0.1;tag=1928301774"
	b.SetBytes(int64(len(key)))
	for b.Loop() {
		balance.Hash(key)
	}
}

func BenchmarkPlace(b *testing.B) {
	c := make([]balance.Candidate, 20)
	for i := range c {
		c[i] = balance.Candidate{Active: i < 15, Standby: i >= 15, Sessions: i % 7, SessionCap: 6}
	}
	for b.Loop() {
		balance.Place(c)
	}
}
