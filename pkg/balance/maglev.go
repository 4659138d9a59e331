package balance

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

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
	// entriesPerInstance is the Maglev paper's M > 100·N rule: it keeps the per-instance
	// entry counts within 1 % of each other.
	entriesPerInstance = 100
)

// MaglevOption configures NewMaglev.
type MaglevOption func(*maglevConfig)

type maglevConfig struct{ tableSize int }

// WithTableSize sets the lookup table size M. It must be a prime in [number of ids,
// MaxTableSize]; 0 keeps the default (see DefaultTableSize). Pin it when the instance count
// moves across a default boundary often and every such move must stay minimally disruptive.
func WithTableSize(m int) MaglevOption { return func(c *maglevConfig) { c.tableSize = m } }

// DefaultTableSize returns the table size NewMaglev uses for n instances: the smallest prime
// ≥ max(65537, P) where P is the smallest power of two ≥ 100·n. That satisfies the paper's
// M ≥ 100·N rule (entries per instance differ by < 1 %), and because P moves only when n crosses
// a power-of-two boundary (n = 655, 1310, 2621, …), adding or removing one instance almost never
// changes M — a changed M would remap nearly every key. Tables for n ≤ 655 have 65537 entries.
func DefaultTableSize(n int) int {
	target := uint64(max(n, 1)) * entriesPerInstance
	p := uint64(1) << bits.Len64(target-1)
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
	table   []int32 // table[j] = index into ids
	entries []int   // entries[i] = number of table entries of ids[i]
	present []int   // indices with entries[i] > 0, ascending
}

// NewMaglev builds the table for ids with the given weights (nil weights = all 1; otherwise
// len(weights) == len(ids) and every weight ≥ 1). Indices returned by lookups are indices into
// ids. It returns an error wrapping ErrInvalidMaglev for no ids, an empty or duplicate id, a bad
// weight or a table size that is not a prime in [len(ids), MaxTableSize]. Building for 1,000
// instances takes a few milliseconds.
func NewMaglev(ids []string, weights []uint32, opts ...MaglevOption) (*Maglev, error) {
	var cfg maglevConfig
	for _, o := range opts {
		o(&cfg)
	}
	n := len(ids)
	if n == 0 {
		return nil, fmt.Errorf("%w: no ids", ErrInvalidMaglev)
	}
	if weights != nil && len(weights) != n {
		return nil, fmt.Errorf("%w: %d weights for %d ids", ErrInvalidMaglev, len(weights), n)
	}
	m := cfg.tableSize
	if m == 0 {
		m = DefaultTableSize(n)
	}
	if m < n || m > MaxTableSize || !isPrime(m) {
		return nil, fmt.Errorf("%w: table size %d must be a prime in [%d, %d]", ErrInvalidMaglev, m, n, MaxTableSize)
	}
	order := make([]int, n) // ids indices sorted by id
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case ids[a] < ids[b]:
			return -1
		case ids[a] > ids[b]:
			return 1
		}
		return 0
	})
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

	t := &Maglev{
		ids:     slices.Clone(ids),
		table:   make([]int32, m),
		entries: make([]int, n),
	}
	for j := range t.table {
		t.table[j] = -1
	}
	h := make(turnHeap, n)
	for rank, i := range order {
		w := uint32(1)
		if weights != nil {
			w = weights[i]
		}
		offset, skip := permutation(ids[i], uint64(m))
		h[rank] = &turn{idx: i, rank: rank, weight: uint64(w), next: offset, skip: skip}
	}
	heap.Init(&h)
	um := uint64(m)
	for filled := 0; filled < m; filled++ {
		tn := h[0]
		for t.table[tn.next] >= 0 {
			tn.next += tn.skip
			if tn.next >= um {
				tn.next -= um
			}
		}
		t.table[tn.next] = int32(tn.idx)
		t.entries[tn.idx]++
		tn.count++
		heap.Fix(&h, 0)
	}
	for i, e := range t.entries {
		if e > 0 {
			t.present = append(t.present, i)
		}
	}
	return t, nil
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
	idx, rank     int
	weight, count uint64
	next, skip    uint64
}

// turnHeap orders instances by (count+1)/weight — the "time" of their next turn — then by rank.
type turnHeap []*turn

func (h turnHeap) Len() int { return len(h) }
func (h turnHeap) Less(a, b int) bool {
	x, y := (h[a].count+1)*h[b].weight, (h[b].count+1)*h[a].weight
	if x != y {
		return x < y
	}
	return h[a].rank < h[b].rank
}
func (h turnHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *turnHeap) Push(any)     { panic("balance: turnHeap.Push is not used") }
func (h *turnHeap) Pop() any     { panic("balance: turnHeap.Pop is not used") }

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
// as 1); a factor of +Inf is plain Lookup. A nil usable means all are usable.
//
// LookupBounded is O(N) per call (it sums the loads) and does not allocate. It reads the loads
// as a snapshot and reserves nothing: concurrent callers that must never exceed the cap reserve
// with a compare-and-swap on the chosen instance's counter against BoundedLoadCap and retry on
// failure. Under concurrent load changes the walk may find no instance under the cap; it then
// falls back to Lookup(h, usable). It returns -1, false only if no instance is usable.
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
	limit := BoundedLoadCap(total, count, factor)
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
