package balance_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/balance"
)

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.%d.%d:8080", i/250, i%250)
	}
	return out
}

// keys returns n pseudo-random key hashes, the same for every call.
func keys(n int) []uint64 {
	r := rand.New(rand.NewPCG(42, 1))
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

func mustMaglev(t testing.TB, ids []string, weights []uint32, opts ...balance.MaglevOption) *balance.Maglev {
	t.Helper()
	m, err := balance.NewMaglev(ids, weights, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func maxAvg(c []int) float64 {
	sum, hi := 0, 0
	for _, v := range c {
		sum += v
		hi = max(hi, v)
	}
	return float64(hi) / (float64(sum) / float64(len(c)))
}

// owners maps every key to the id of its instance (usable may be nil).
func owners(m *balance.Maglev, ks []uint64, usable func(int) bool) []string {
	ids := m.IDs()
	out := make([]string, len(ks))
	for k, h := range ks {
		i, ok := m.Lookup(h, usable)
		if !ok {
			out[k] = ""
			continue
		}
		out[k] = ids[i]
	}
	return out
}

func TestDefaultTableSize(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, 65537}, {3, 65537}, {10, 65537}, {100, 65537}, {128, 65537},
		{129, 131101}, {256, 131101}, {257, 262147}, {999, 524309}, {1000, 524309}, {1024, 524309},
		{1025, 1048583}, {8192, 4194319}, {8193, 5000011}, {50000, 5000011},
	} {
		got := balance.DefaultTableSize(tc.n)
		if got != tc.want {
			t.Errorf("DefaultTableSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
		if got < 100*tc.n {
			t.Errorf("DefaultTableSize(%d) = %d < 100·N", tc.n, got)
		}
	}
}

func TestNewMaglevErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ids     []string
		weights []uint32
		opts    []balance.MaglevOption
	}{
		{"no ids", nil, nil, nil},
		{"duplicate id", []string{"a", "b", "a"}, nil, nil},
		{"empty id", []string{"a", ""}, nil, nil},
		{"weights length", []string{"a", "b"}, []uint32{1}, nil},
		{"zero weight", []string{"a", "b"}, []uint32{1, 0}, nil},
		{"table size not prime", []string{"a"}, nil, []balance.MaglevOption{balance.WithTableSize(65536)}},
		{"table size below N", []string{"a", "b", "c"}, nil, []balance.MaglevOption{balance.WithTableSize(2)}},
		{"table size too large", []string{"a"}, nil, []balance.MaglevOption{balance.WithTableSize(5000077)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := balance.NewMaglev(tc.ids, tc.weights, tc.opts...)
			if !errors.Is(err, balance.ErrInvalidMaglev) {
				t.Errorf("err = %v, want ErrInvalidMaglev", err)
			}
		})
	}
	m := mustMaglev(t, []string{"a", "b"}, nil, balance.WithTableSize(251))
	if m.TableSize() != 251 {
		t.Errorf("TableSize() = %d, want 251", m.TableSize())
	}
}

func TestMaglevBalance(t *testing.T) {
	ks := keys(1_000_000)
	for _, n := range []int{3, 10, 100, 1000} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			m := mustMaglev(t, ids(n), nil)
			if m.TableSize() < 100*n {
				t.Fatalf("TableSize() = %d < 100·N", m.TableSize())
			}
			entries := m.Entries()
			lo, hi := slices.Min(entries), slices.Max(entries)
			if hi-lo > 1 {
				t.Errorf("entries per instance range %d..%d, want ⌊M/N⌋..⌈M/N⌉", lo, hi)
			}
			if r := maxAvg(entries); r > 1.01 {
				t.Errorf("max/avg table entries = %.4f, want ≤ 1.01", r)
			}
			load := make([]int, n)
			for _, h := range ks {
				i, _ := m.Lookup(h, nil)
				load[i]++
			}
			r := maxAvg(load)
			t.Logf("N=%d M=%d: entries %d..%d (max/avg %.4f); 1M keys max/avg load %.4f", n, m.TableSize(), lo, hi, maxAvg(entries), r)
			if n == 10 && r > 1.10 {
				t.Errorf("max/avg load over 1M keys = %.4f, want ≤ 1.10", r)
			}
		})
	}
}

func TestMaglevIndependentOfIDOrder(t *testing.T) {
	a := ids(50)
	b := slices.Clone(a)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	ma, mb := mustMaglev(t, a, nil), mustMaglev(t, b, nil)
	ks := keys(100_000)
	if diff := cmp.Diff(owners(ma, ks, nil), owners(mb, ks, nil)); diff != "" {
		t.Errorf("owners depend on the order of ids (-sorted +shuffled):\n%.2000s", diff)
	}
	if diff := cmp.Diff(a, ma.IDs()); diff != "" {
		t.Errorf("IDs() (-want +got):\n%s", diff)
	}
}

func TestMaglevDisruptionOnRemove(t *testing.T) {
	ks := keys(1_000_000)
	for _, tc := range []struct {
		n, removed int
		maxOther   float64 // fraction of keys not on the removed instance that may move
	}{
		{10, 3, 0.01},
		{1000, 500, 0.005},
	} {
		t.Run(fmt.Sprintf("N=%d", tc.n), func(t *testing.T) {
			all := ids(tc.n)
			before := mustMaglev(t, all, nil)
			rest := slices.Delete(slices.Clone(all), tc.removed, tc.removed+1)
			after := mustMaglev(t, rest, nil)
			if before.TableSize() != after.TableSize() {
				t.Fatalf("table size changed %d → %d on removing one of %d", before.TableSize(), after.TableSize(), tc.n)
			}
			ob, oa := owners(before, ks, nil), owners(after, ks, nil)
			gone := all[tc.removed]
			onRemoved, others, moved := 0, 0, 0
			for k := range ks {
				if oa[k] == gone {
					t.Fatalf("key %d still maps to the removed instance", k)
				}
				if ob[k] == gone {
					onRemoved++
					continue
				}
				others++
				if ob[k] != oa[k] {
					moved++
				}
			}
			frac := float64(moved) / float64(others)
			t.Logf("N=%d M=%d remove 1: %d keys had to move (on the removed instance, optimum %.0f); %d of %d other keys moved (%.3f %%)",
				tc.n, before.TableSize(), onRemoved, float64(len(ks))/float64(tc.n), moved, others, 100*frac)
			if frac > tc.maxOther {
				t.Errorf("%.3f %% of keys not on the removed instance moved, want ≤ %.1f %%", 100*frac, 100*tc.maxOther)
			}
		})
	}
}

func TestMaglevDisruptionOnAdd(t *testing.T) {
	ks := keys(1_000_000)
	all := ids(11)
	before := mustMaglev(t, all[:10], nil)
	after := mustMaglev(t, all, nil)
	ob, oa := owners(before, ks, nil), owners(after, ks, nil)
	toNew, elsewhere := 0, 0
	for k := range ks {
		switch {
		case oa[k] == all[10]:
			toNew++
		case oa[k] != ob[k]:
			elsewhere++
		}
	}
	frac := float64(elsewhere) / float64(len(ks)-toNew)
	t.Logf("N=10→11: %d keys moved to the new instance (optimum %d); %d others moved (%.3f %%)", toNew, len(ks)/11, elsewhere, 100*frac)
	if frac > 0.01 {
		t.Errorf("%.3f %% of keys moved between existing instances, want ≤ 1 %%", 100*frac)
	}
}

func TestMaglevUnhealthySkip(t *testing.T) {
	ks := keys(1_000_000)
	for _, n := range []int{10, 1000} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			m := mustMaglev(t, ids(n), nil)
			bad := n / 3
			var down atomic.Bool
			usable := func(i int) bool { return i != bad || !down.Load() }
			before := make([]int, len(ks))
			for k, h := range ks {
				before[k], _ = m.Lookup(h, usable)
			}
			down.Store(true)
			spread := make([]int, n)
			movedOthers, movedBad := 0, 0
			for k, h := range ks {
				i, ok := m.Lookup(h, usable)
				if !ok || i == bad {
					t.Fatalf("key %d → %d, %v with instance %d down", k, i, ok, bad)
				}
				if before[k] == bad {
					movedBad++
					spread[i]++
				} else if i != before[k] {
					movedOthers++
				}
			}
			if movedOthers != 0 {
				t.Errorf("%d keys of other instances moved when instance %d went down, want 0", movedOthers, bad)
			}
			receivers := 0
			for _, c := range spread {
				if c > 0 {
					receivers++
				}
			}
			t.Logf("N=%d: %d keys of the down instance spread over %d of %d others (max to one: %d)", n, movedBad, receivers, n-1, slices.Max(spread))
			if n == 10 {
				fair := float64(movedBad) / 9
				for i, c := range spread {
					if i != bad && (float64(c) < 0.5*fair || float64(c) > 1.5*fair) {
						t.Errorf("instance %d received %d of the down instance's keys, want %.0f ± 50 %%", i, c, fair)
					}
				}
			} else if receivers < 200 || slices.Max(spread)*20 > movedBad {
				// Walking forward hands each of the down instance's 524 table entries to the
				// owner of the next entry: about 370 receivers are expected, none with more
				// than a few keys.
				t.Errorf("down instance's %d keys went to %d of %d others, at most %d to one; want ≥ 200 and ≤ 5 %%",
					movedBad, receivers, n-1, slices.Max(spread))
			}
			// The walk goes to the owner of the next table entry not owned by the down instance.
			size := uint64(m.TableSize())
			for _, h := range ks[:2000] {
				j := h % size
				if owner, _ := m.Lookup(j, nil); owner != bad {
					continue
				}
				want := bad
				for want == bad {
					j = (j + 1) % size
					want, _ = m.Lookup(j, nil)
				}
				if got, _ := m.Lookup(h, usable); got != want {
					t.Fatalf("key %#x → %d, want the next entry's owner %d", h, got, want)
				}
			}
			down.Store(false)
			for k, h := range ks {
				if i, _ := m.Lookup(h, usable); i != before[k] {
					t.Fatalf("key %d → %d after recovery, want %d", k, i, before[k])
				}
			}
		})
	}
}

func TestMaglevNothingUsable(t *testing.T) {
	m := mustMaglev(t, ids(100), nil)
	calls := 0
	i, ok := m.Lookup(12345, func(int) bool { calls++; return false })
	if ok {
		t.Fatalf("Lookup = %d, true with nothing usable", i)
	}
	if calls > 300 {
		t.Errorf("Lookup called usable %d times for 100 instances, want O(N)", calls)
	}
	only := 77
	for _, h := range keys(1000) {
		if i, ok := m.Lookup(h, func(i int) bool { return i == only }); !ok || i != only {
			t.Fatalf("Lookup with only %d usable = %d, %v", only, i, ok)
		}
	}
}

func TestMaglevWeights(t *testing.T) {
	ks := keys(1_000_000)
	for _, weights := range [][]uint32{{2, 1}, {2, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {1, 3, 5, 1}, {1000, 1, 1}} {
		t.Run(fmt.Sprint(weights), func(t *testing.T) {
			m := mustMaglev(t, ids(len(weights)), weights)
			load := make([]int, len(weights))
			for _, h := range ks {
				i, _ := m.Lookup(h, nil)
				load[i]++
			}
			entries := m.Entries()
			var wsum uint32
			for _, w := range weights {
				wsum += w
			}
			t.Logf("weights %v: entries %v, 1M keys %v", weights, entries, load)
			for i, w := range weights {
				wantEntries := float64(m.TableSize()) * float64(w) / float64(wsum)
				if math.Abs(float64(entries[i])-wantEntries) > 1 {
					t.Errorf("instance %d: %d entries, want %.1f ± 1", i, entries[i], wantEntries)
				}
				wantKeys := float64(len(ks)) * float64(w) / float64(wsum)
				if math.Abs(float64(load[i])-wantKeys) > 0.05*wantKeys {
					t.Errorf("instance %d: %d keys, want %.0f ± 5 %%", i, load[i], wantKeys)
				}
			}
			// weight 2 vs weight 1: ≈ 2× the keys
			if weights[0] == 2 {
				if r := float64(load[0]) / float64(load[1]); r < 1.9 || r > 2.1 {
					t.Errorf("weight 2 / weight 1 key ratio = %.3f, want 2 ± 5 %%", r)
				}
			}
		})
	}
}

func TestBoundedLoadCap(t *testing.T) {
	for _, tc := range []struct {
		total, usable int
		factor        float64
		want          int
	}{
		{0, 4, 1.25, 1}, {99, 4, 1.25, 32}, {100, 4, 1.25, 32}, {7, 4, 1, 2}, {7, 4, 0.5, 2}, {10, 0, 1.25, 0},
	} {
		if got := balance.BoundedLoadCap(tc.total, tc.usable, tc.factor); got != tc.want {
			t.Errorf("BoundedLoadCap(%d, %d, %v) = %d, want %d", tc.total, tc.usable, tc.factor, got, tc.want)
		}
	}
}

// zipfKeys returns a skewed key stream: a few hot keys carry most of the traffic.
func zipfKeys(n int, seed uint64) []uint64 {
	r := rand.New(rand.NewPCG(seed, 3))
	z := rand.NewZipf(r, 1.2, 1, 999)
	out := make([]uint64, n)
	for i := range out {
		out[i] = balance.Hash(fmt.Sprintf("call-%d", z.Uint64()))
	}
	return out
}

func TestMaglevBoundedLoadConcurrent(t *testing.T) {
	const n, factor, goroutines, perG = 10, 1.25, 8, 4000
	m := mustMaglev(t, ids(n), nil)

	// Without the bound the skewed stream overloads the hot keys' instances: the test can fail.
	plain := make([]int, n)
	for _, h := range zipfKeys(goroutines*perG, 99) {
		i, _ := m.Lookup(h, nil)
		plain[i]++
	}
	capPlain := int(math.Ceil(factor * float64(goroutines*perG) / n))
	if slices.Max(plain) <= capPlain {
		t.Fatalf("unbounded max load %d ≤ %d: the key stream is not skewed enough to test the bound", slices.Max(plain), capPlain)
	}

	var loads [n]atomic.Int64
	var total atomic.Int64
	load := func(i int) int { return int(loads[i].Load()) }
	var wg sync.WaitGroup
	var home, spilled atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, h := range zipfKeys(perG, uint64(g)) {
				for {
					i, ok := m.LookupBounded(h, nil, load, factor)
					if !ok {
						t.Error("LookupBounded failed")
						return
					}
					// Reserve: the snapshot total excludes this unit, so the cap can only be
					// stricter than the final one.
					v, tot := loads[i].Load(), total.Load()
					if int(v)+1 > balance.BoundedLoadCap(int(tot), n, factor) || !loads[i].CompareAndSwap(v, v+1) {
						continue
					}
					total.Add(1)
					if j, _ := m.Lookup(h, nil); j == i {
						home.Add(1)
					} else {
						spilled.Add(1)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	final := make([]int, n)
	for i := range final {
		final[i] = load(i)
	}
	limit := int(math.Ceil(factor * float64(total.Load()) / n))
	t.Logf("factor %.2f, %d keys: unbounded max %d; bounded loads %v (cap %d); %d on their home instance, %d spilled",
		factor, total.Load(), slices.Max(plain), final, limit, home.Load(), spilled.Load())
	if slices.Max(final) > limit {
		t.Errorf("max load %d > ceil(%.2f × avg) = %d", slices.Max(final), factor, limit)
	}
}

func TestMaglevBoundedLoadKeepsKeysHome(t *testing.T) {
	m := mustMaglev(t, ids(10), nil)
	loads := make([]int, 10)
	for i := range loads {
		loads[i] = 100 // away from the cap's rounding at tiny totals
	}
	load := func(i int) int { return loads[i] }
	ks := keys(10_000)
	// Uniform keys under a generous bound stay on their Lookup instance.
	for _, h := range ks {
		i, _ := m.LookupBounded(h, nil, load, 2)
		if j, _ := m.Lookup(h, nil); i != j {
			t.Fatalf("LookupBounded moved a key under a factor-2 bound: %d vs %d (loads %v)", i, j, loads)
		}
		loads[i]++
	}
	// A full home instance sends the key to the next usable instance under the cap, and the
	// key comes back when the home has room again.
	h := ks[0]
	homeIdx, _ := m.Lookup(h, nil)
	saved := loads[homeIdx]
	loads[homeIdx] = 1_000_000
	i, _ := m.LookupBounded(h, nil, load, 1.25)
	if i == homeIdx {
		t.Fatal("key stayed on an instance above the cap")
	}
	// Also skips an unusable instance while bounding.
	j, _ := m.LookupBounded(h, func(k int) bool { return k != i }, load, 1.25)
	if j == i || j == homeIdx {
		t.Fatalf("LookupBounded = %d with %d unusable and %d full", j, i, homeIdx)
	}
	loads[homeIdx] = saved
	if k, _ := m.LookupBounded(h, nil, load, 1.25); k != homeIdx {
		t.Errorf("key did not return home after the load fell: %d, want %d", k, homeIdx)
	}
	if k, ok := m.LookupBounded(h, func(int) bool { return false }, load, 1.25); ok {
		t.Errorf("LookupBounded with nothing usable = %d, true", k)
	}
	// An explicit cap below every load falls back to the plain lookup.
	if k, _ := m.LookupBoundedCap(h, nil, load, 0); k != homeIdx {
		t.Errorf("LookupBoundedCap with an unreachable cap = %d, want the Lookup result %d", k, homeIdx)
	}
	// A cap that only one instance satisfies picks it whatever the key.
	loads[homeIdx] = 1_000_000
	for i := range loads {
		if i != 7 {
			loads[i] += 1_000_000
		}
	}
	for _, h := range ks[:100] {
		if k, _ := m.LookupBoundedCap(h, nil, load, loads[7]+1); k != 7 {
			t.Fatalf("LookupBoundedCap = %d, want 7, the only instance under the cap", k)
		}
	}
}

func TestHashIsXXH64(t *testing.T) {
	// Reference values of XXH64 with seed 0.
	for _, tc := range []struct {
		in   string
		want uint64
	}{{"", 0xef46db3751d8e999}, {"a", 0xd24ec4f1a98c6e5b}, {"abc", 0x44bc2cf5ad770999}} {
		if got := balance.Hash(tc.in); got != tc.want {
			t.Errorf("Hash(%q) = %#x, want %#x", tc.in, got, tc.want)
		}
	}
}
