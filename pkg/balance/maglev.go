package balance

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// ErrInvalidMaglev is wrapped by NewMaglev's errors (no ids, duplicate or empty id, weights of
// the wrong length or zero, bad table size).
var ErrInvalidMaglev = errors.New("balance: invalid maglev configuration")

const (
	// MinTableSize is the smallest default Maglev table size (a prime, as in the Maglev paper
	// and Envoy's default).
	MinTableSize = 65537
	// MaxTableSize is the largest table size NewMaglev accepts (Envoy's limit).
	MaxTableSize = 5000011
	// MaxInstances is the largest number of ids NewMaglev accepts.
	MaxInstances = 65535
	// defaultEntriesPerInstance is the target M/N of the default table size. The paper's
	// M ≥ 100·N bounds the imbalance (< 1 %); the disruption on removing one of N instances —
	// keys of *other* instances that move on a rebuild — also shrinks with M/N, and needs
	// M/N ≳ 500 to stay ≤ 0.5 % at N = 1,000 (measured: 0.58 % at M/N = 131, 0.51 % at 262,
	// 0.40 % at 524).
	defaultEntriesPerInstance = 512
)

// MaglevOption configures NewMaglev.
type MaglevOption func(*maglevConfig)

type maglevConfig struct{ tableSize int }

// WithTableSize sets the lookup table size M. It must be a prime in [number of ids,
// MaxTableSize]; 0 keeps the default (see DefaultTableSize). Every tether replica and every
// rebuild must use the same M for keys to stay put, so pin it when the instance count often
// crosses a default boundary.
func WithTableSize(m int) MaglevOption { return func(c *maglevConfig) { c.tableSize = m } }

// DefaultTableSize returns the table size NewMaglev uses for n instances: the smallest prime
// ≥ max(65537, P), where P is the smallest power of two ≥ 512·n; if that exceeds MaxTableSize,
// MaxTableSize itself (a prime; ≥ 100·n for n ≤ 50,000).
//
// This satisfies the Maglev paper's M ≥ 100·N rule (entries per instance differ by < 1 %) with
// margin, keeps rebuild disruption low (see the measured numbers in the package tests), and —
// because P changes only when n crosses a power of two (between n = 128 and 129, 256 and 257,
// 512 and 513, …) — adding or removing one instance almost never changes M; a changed M would
// remap nearly every key. Sizes: n ≤ 128 → 65537 entries (128 KiB); n = 129..256 → 131101;
// n = 257..512 → 262147; n = 513..1024 → 524309 (1 MiB). Entries are 2 bytes each.
func DefaultTableSize(n int) int {
	target := uint64(max(n, 1)) * defaultEntriesPerInstance
	p := uint64(1) << bits.Len64(target-1)
	if p >= MaxTableSize {
		return MaxTableSize
	}
	return nextPrime(max(int(p), MinTableSize))
}

// Maglev is an immutable weighted Maglev lookup table (Eisenbud et al., NSDI'16, §3.4) over a set
// of instance ids. It is safe for concurrent use. Build a new one when the set or the weights
// change; health changes do not need a rebuild (see Lookup).
//
// Each id gets a permutation of the table from two xxHash64 hashes of the id (offset = h1 mod M,
// skip = h2 mod (M−1) + 1), and the table is filled by taking turns: instance i takes its next
// preferred free entry whenever its filled count divided by its weight is the lowest (ties go to
// the id that sorts first), so entries are proportional to weight (equal weights: every instance
// gets ⌊M/N⌋ or ⌈M/N⌉ entries). The table depends only on the (id, weight) pairs, not on their
// order in the ids slice, so every tether replica builds the same table. An instance whose share
// weight/Σweight is below 1/M may get no entry and is then never chosen.
type Maglev struct {
	ids     []string
	table   []uint16 // table[j] = index into ids
	entries []int    // entries[i] = number of table entries of ids[i]
	present []int    // indices with entries[i] > 0, ascending
}

// NewMaglev builds the table for ids with the given weights (nil weights = all 1; otherwise
// len(weights) == len(ids) and every weight ≥ 1). Indices returned by lookups are indices into
// ids. It returns an error wrapping ErrInvalidMaglev for no ids, an empty or duplicate id, a bad
// weight, more than MaxInstances ids, or a table size that is not a prime in [len(ids),
// MaxTableSize]. The build is O(M log M) probes (plus O(M log N) heap steps when the weights
// differ): a few milliseconds for 65537 entries, tens of milliseconds for N = 1,000 at the
// default M = 524309 — rebuild only when ids or weights change.
func NewMaglev(ids []string, weights []uint32, opts ...MaglevOption) (*Maglev, error) {
	var cfg maglevConfig
	for _, o := range opts {
		o(&cfg)
	}
	m, err := maglevSize(len(ids), len(weights), weights != nil, cfg.tableSize)
	if err != nil {
		return nil, err
	}
	order, err := maglevOrder(ids, weights)
	if err != nil {
		return nil, err
	}
	t := &Maglev{
		ids:     slices.Clone(ids),
		table:   make([]uint16, m),
		entries: make([]int, len(ids)),
	}
	turns := make([]turn, len(ids))
	for rank, i := range order {
		w := uint64(1)
		if weights != nil {
			w = uint64(weights[i])
		}
		offset, skip := permutation(ids[i], uint64(m))
		turns[rank] = turn{idx: uint16(i), rank: int32(rank), weight: w, next: offset, skip: skip}
	}
	// Sort by the first turn time, 1/weight, then rank: the order turns are taken in.
	slices.SortFunc(turns, func(a, b turn) int {
		if less(&a, &b) {
			return -1
		}
		return 1
	})
	f := &filler{t: t, filled: make([]uint64, (m+63)/64), m: uint64(m)}
	if equalWeights(weights) {
		f.roundRobin(turns)
	} else {
		f.weighted(turns)
	}
	for i, e := range t.entries {
		if e > 0 {
			t.present = append(t.present, i)
		}
	}
	return t, nil
}

// maglevSize checks the counts of ids and weights and returns the table size: size, or the
// default for n ids when size is 0.
func maglevSize(n, nWeights int, hasWeights bool, size int) (int, error) {
	if n == 0 {
		return 0, fmt.Errorf("%w: no ids", ErrInvalidMaglev)
	}
	if n > MaxInstances {
		return 0, fmt.Errorf("%w: %d ids, at most %d", ErrInvalidMaglev, n, MaxInstances)
	}
	if hasWeights && nWeights != n {
		return 0, fmt.Errorf("%w: %d weights for %d ids", ErrInvalidMaglev, nWeights, n)
	}
	m := size
	if m == 0 {
		m = DefaultTableSize(n)
	}
	if m < n || m > MaxTableSize || !isPrime(m) {
		return 0, fmt.Errorf("%w: table size %d must be a prime in [%d, %d]", ErrInvalidMaglev, m, n, MaxTableSize)
	}
	return m, nil
}

// maglevOrder returns the indices of ids sorted by id, checking that every id is set and
// unique and has a weight of at least 1.
func maglevOrder(ids []string, weights []uint32) ([]int, error) {
	order := make([]int, len(ids))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(ids[a], ids[b]) })
	for k, i := range order {
		if ids[i] == "" {
			return nil, fmt.Errorf("%w: empty id at index %d", ErrInvalidMaglev, i)
		}
		if k > 0 && ids[order[k-1]] == ids[i] {
			return nil, fmt.Errorf("%w: duplicate id %q", ErrInvalidMaglev, ids[i])
		}
		if weights != nil && weights[i] == 0 {
			return nil, fmt.Errorf("%w: id %q has weight 0", ErrInvalidMaglev, ids[i])
		}
	}
	return order, nil
}

// filler fills a table of m entries, turn by turn.
type filler struct {
	t *Maglev
	// filled is a bitset of claimed entries: probing it instead of the table keeps the random
	// accesses in cache (M/8 bytes).
	filled []uint64
	m      uint64
}

// claim gives tn the next entry of its permutation that is not claimed yet.
func (f *filler) claim(tn *turn) {
	for f.filled[tn.next>>6]&(1<<(tn.next&63)) != 0 {
		tn.next += tn.skip
		if tn.next >= f.m {
			tn.next -= f.m
		}
	}
	f.filled[tn.next>>6] |= 1 << (tn.next & 63)
	f.t.table[tn.next] = tn.idx
	f.t.entries[tn.idx]++
	tn.count++
}

// roundRobin fills the table for equal weights. Every turn time is (count+1)/w with the same
// w: the heap order is plain round robin in rank order, the paper's populate loop. No heap.
func (f *filler) roundRobin(turns []turn) {
	m := int(f.m)
	for k := 0; k < m; {
		for r := range turns {
			f.claim(&turns[r])
			if k++; k == m {
				break
			}
		}
	}
}

// weighted fills the table from a binary min-heap of next-turn times. The time
// (count+1)/weight is kept as a float64: IEEE division is correctly rounded, so equal fractions
// give equal floats, and distinct fractions with count ≤ MaxTableSize and weight < 2³² differ by
// far more than one ulp — the order is exact and the same on every platform.
func (f *filler) weighted(turns []turn) {
	h := make([]heapItem, len(turns))
	for r := range h {
		h[r] = heapItem{at: 1 / float64(turns[r].weight), rank: turns[r].rank, pos: int32(r)}
	}
	// turns is sorted by (1/weight, rank), so h is already a valid heap.
	for range f.m {
		tn := &turns[h[0].pos]
		f.claim(tn)
		h[0].at = float64(tn.count+1) / float64(tn.weight)
		siftDown(h)
	}
}

// equalWeights reports whether all weights are the same (nil counts as all 1).
func equalWeights(w []uint32) bool {
	for _, x := range w {
		if x != w[0] {
			return false
		}
	}
	return true
}

// permutation returns instance id's preference list parameters for a table of size m.
func permutation(id string, m uint64) (offset, skip uint64) {
	d := xxhash.NewWithSeed(0x5EED_0FF5E7)
	_, _ = d.WriteString(id)
	h1 := d.Sum64()
	d.ResetWithSeed(0x5EED_5C1B)
	_, _ = d.WriteString(id)
	h2 := d.Sum64()
	return h1 % m, h2%(m-1) + 1
}

// turn is one instance's state while the table is filled.
type turn struct {
	weight, count uint64
	next, skip    uint64
	rank          int32
	idx           uint16
}

// less orders turns by the time of their first turn, 1/weight (compared exactly), then by rank
// (id order). With equal weights this is plain id order, the paper's populate loop.
func less(a, b *turn) bool {
	x, y := b.weight, a.weight
	if x != y {
		return x < y
	}
	return a.rank < b.rank
}

// heapItem is one instance's next turn time in the weighted populate heap.
type heapItem struct {
	at   float64
	rank int32 // position in id order: the tie-break
	pos  int32 // position in turns
}

// siftDown restores the min-heap order of h by (at, rank) after h[0].at grew.
func siftDown(h []heapItem) {
	lessItem := func(a, b *heapItem) bool { return a.at < b.at || (a.at == b.at && a.rank < b.rank) }
	i, n := 0, len(h)
	top := h[0]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && lessItem(&h[r], &h[c]) {
			c = r
		}
		if !lessItem(&h[c], &top) {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = top
}

// IDs returns a copy of the ids the table was built for, in the caller's original order.
func (m *Maglev) IDs() []string { return slices.Clone(m.ids) }

// TableSize returns the number of table entries M (a prime).
func (m *Maglev) TableSize() int { return len(m.table) }

// Entries returns a copy of the number of table entries of each instance, by index into IDs.
func (m *Maglev) Entries() []int { return slices.Clone(m.entries) }

// Lookup returns the instance for hash h: the owner of entry h mod M if usable(i) (a nil usable
// means all are usable); otherwise it walks forward through the table (entry j+1, j+2, …,
// wrapping) to the first entry whose instance is usable. Marking an instance unusable therefore
// moves only that instance's keys (each to the next usable entry after it), never a key of
// another instance, and when it becomes usable again exactly its keys return — no rebuild.
// It returns -1, false when no instance with entries is usable.
//
// Lookup does not allocate. usable is called at most once per distinct run of entries walked;
// with one instance in N unusable the walk is ~1 step on average.
func (m *Maglev) Lookup(h uint64, usable func(int) bool) (int, bool) {
	j := int(h % uint64(len(m.table)))
	i := int(m.table[j])
	if usable == nil || usable(i) {
		return i, true
	}
	return m.walk(j, i, usable)
}

// walk scans forward from entry j (owned by the rejected instance prev) for the first entry
// whose instance passes ok. After N steps without success it checks whether any instance passes
// at all, so that a walk over a table with nothing usable ends after O(N) calls rather than M.
func (m *Maglev) walk(j, prev int, ok func(int) bool) (int, bool) {
	size := len(m.table)
	checkedAll := false
	for step := 1; step < size; step++ {
		j++
		if j == size {
			j = 0
		}
		i := int(m.table[j])
		if i == prev {
			continue
		}
		if ok(i) {
			return i, true
		}
		prev = i
		if !checkedAll && step >= len(m.ids) {
			checkedAll = true
			if !slices.ContainsFunc(m.present, ok) {
				return -1, false
			}
		}
	}
	return -1, false
}

// BoundedLoadCap returns the bounded-load capacity used by LookupBounded:
//
//	cap = ceil(factor × (totalLoad + 1) / usableCount)
//
// i.e. the load an instance may reach after taking one more unit, when the usable instances
// together carry totalLoad and the new unit is counted in the average (Mirrokni, Thorup and
// Zadimoghaddam's ⌈(1+ε)·m/n⌉ with factor = 1+ε). Because factor ≥ 1, usableCount × cap ≥
// totalLoad+1, so at least one usable instance is always below its cap. factor < 1 counts as 1;
// usableCount ≤ 0 gives 0.
func BoundedLoadCap(totalLoad, usableCount int, factor float64) int {
	if usableCount <= 0 {
		return 0
	}
	factor = max(factor, 1)
	return int(math.Ceil(factor * float64(max(totalLoad, 0)+1) / float64(usableCount)))
}

// LookupBounded is Lookup with bounded load (consistent hashing with bounded loads, as in
// Envoy's and HAProxy's hash balance factor): an instance counts as usable only if usable(i) and
// load(i)+1 ≤ BoundedLoadCap(totalLoad, usableCount, factor), where totalLoad is the sum of
// load(i) over usable instances and usableCount their number (instances with no table entry are
// not counted). The walk order is Lookup's, so a key leaves its instance only while that
// instance is at its cap, and returns once it has room. factor must be ≥ 1 (smaller values count
// as 1); a factor of +Inf or a nil load is plain Lookup. A nil usable means all are usable.
//
// LookupBounded calls usable and load once per instance to sum the loads (O(N); about 0.2 µs at
// N = 10, 10 µs at N = 1,000); callers that keep a running total use LookupBoundedCap, which is
// O(1) expected. It does not allocate. It reads the loads as a snapshot and reserves nothing:
// concurrent callers that must never exceed the cap reserve with a compare-and-swap on the
// chosen instance's counter against BoundedLoadCap and retry on failure (see the package tests).
// It returns -1, false only if no instance is usable.
func (m *Maglev) LookupBounded(h uint64, usable func(int) bool, load func(int) int, factor float64) (int, bool) {
	if math.IsInf(factor, 1) || load == nil {
		return m.Lookup(h, usable)
	}
	total, count := 0, 0
	for _, i := range m.present {
		if usable == nil || usable(i) {
			total += max(load(i), 0)
			count++
		}
	}
	if count == 0 {
		return -1, false
	}
	return m.LookupBoundedCap(h, usable, load, BoundedLoadCap(total, count, factor))
}

// LookupBoundedCap is the walk of LookupBounded with the cap supplied by the caller, typically
// BoundedLoadCap(total, usableCount, factor) from counters the caller maintains: it returns the
// first instance in Lookup's walk order with usable(i) and load(i)+1 ≤ limit. If none is under
// the limit (possible only when the limit is below the bound's guarantee, or the loads changed
// concurrently) it falls back to Lookup(h, usable). It does not allocate; -1, false only if no
// instance is usable.
func (m *Maglev) LookupBoundedCap(h uint64, usable func(int) bool, load func(int) int, limit int) (int, bool) {
	ok := func(i int) bool { return (usable == nil || usable(i)) && load(i)+1 <= limit }
	j := int(h % uint64(len(m.table)))
	i := int(m.table[j])
	if ok(i) {
		return i, true
	}
	if k, found := m.walk(j, i, ok); found {
		return k, true
	}
	return m.Lookup(h, usable)
}

// isPrime reports whether n is prime (trial division; n ≤ MaxTableSize in practice).
func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	if n%2 == 0 {
		return n == 2
	}
	for d := 3; d*d <= n; d += 2 {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// nextPrime returns the smallest prime ≥ n.
func nextPrime(n int) int {
	for !isPrime(n) {
		n++
	}
	return n
}
