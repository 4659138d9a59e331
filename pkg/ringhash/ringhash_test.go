package ringhash

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
)

func TestRequestHash(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header string
		values []string
		want   uint64
		ok     bool
	}{
		{"absent", "x-tether-session", nil, 0, false},
		{"one value", "x-tether-session", []string{"key-1"}, xxhash.Sum64String("key-1"), true},
		{"values joined with a comma in order", "x-tether-session", []string{"b", "a"}, xxhash.Sum64String("b,a"), true},
		{"empty value still hashes", "x-tether-session", []string{""}, xxhash.Sum64String(""), true},
		{"binary header: no hash", "x-key-bin", []string{"k"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, ok := RequestHash(tc.header, tc.values)
			if h != tc.want || ok != tc.ok {
				t.Errorf("RequestHash(%q, %q) = %d, %v; want %d, %v", tc.header, tc.values, h, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestWeights: gRFC A113's fixed-point weights: the endpoint's share of its locality times the
// locality's share of the priority, in UQ1.31, at least 1; a skipped endpoint counts in its
// locality's sum; a zero-weight locality is ignored.
func TestWeights(t *testing.T) {
	half := uint32(1 << 30)
	for _, tc := range []struct {
		name string
		locs []Locality
		want map[string]uint32
	}{
		{"one locality, equal", []Locality{{Weight: 3, Endpoints: []Endpoint{{Key: "a", Weight: 1}, {Key: "b", Weight: 1}, {Key: "c", Weight: 1}}}},
			map[string]uint32{"a": 715827882, "b": 715827882, "c": 715827882}},
		{"unset weight is 1", []Locality{{Weight: 2, Endpoints: []Endpoint{{Key: "a"}, {Key: "b", Weight: 1}}}},
			map[string]uint32{"a": half, "b": half}},
		{"two localities", []Locality{
			{Weight: 1, Endpoints: []Endpoint{{Key: "a", Weight: 1}}},
			{Weight: 3, Endpoints: []Endpoint{{Key: "b", Weight: 1}, {Key: "c", Weight: 2}}}},
			map[string]uint32{"a": 1 << 29, "b": fixedMul(fraction(1, 3), fraction(3, 4)), "c": fixedMul(fraction(2, 3), fraction(3, 4))}},
		{"skipped endpoint still in the sum", []Locality{{Weight: 2, Endpoints: []Endpoint{{Key: "a", Weight: 1}, {Key: "d", Weight: 1, Skip: true}}}},
			map[string]uint32{"a": half}},
		{"zero-weight locality ignored", []Locality{{Weight: 0, Endpoints: []Endpoint{{Key: "z"}}}, {Weight: 1, Endpoints: []Endpoint{{Key: "a"}}}},
			map[string]uint32{"a": 1 << 31}},
		{"tiny share is at least 1", []Locality{{Weight: 1, Endpoints: []Endpoint{{Key: "a", Weight: 1}, {Key: "b", Weight: math.MaxUint32 - 1}}}},
			map[string]uint32{"a": 1, "b": fixedMul(fraction(math.MaxUint32-1, math.MaxUint32), 1<<31)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, _, err := weighted(tc.locs)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]uint32{}
			for _, ep := range eps {
				got[ep.key] = ep.weight
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("weights (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRingSize: scale = min(ceil(minWeight·min)/minWeight, max), and each endpoint's entries
// follow its weight.
func TestRingSize(t *testing.T) {
	equal := []Locality{{Weight: 3, Endpoints: []Endpoint{{Key: "a"}, {Key: "b"}, {Key: "c"}}}}
	for _, tc := range []struct {
		name     string
		locs     []Locality
		min, max uint64
		size     int
	}{
		{"equal thirds: ceil(1024/3)·3", equal, 0, 0, 1026},
		{"min 8", equal, 8, 0, 9},
		{"capped at 4096", equal, 8 * 1024 * 1024, 8 * 1024 * 1024, 4096},
		{"max 100", equal, 10, 100, 12},
		{"1:1000: 2/minWeight", []Locality{{Weight: 1001, Endpoints: []Endpoint{{Key: "a", Weight: 1}, {Key: "b", Weight: 1000}}}}, 0, 0, 2003},
		{"1:10000 reaches the cap", []Locality{{Weight: 10001, Endpoints: []Endpoint{{Key: "a", Weight: 1}, {Key: "b", Weight: 10000}}}}, 0, 0, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.locs, tc.min, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if r.Size() != tc.size {
				t.Errorf("size %d, want %d", r.Size(), tc.size)
			}
		})
	}
	r, err := New([]Locality{{Weight: 6, Endpoints: []Endpoint{{Key: "a", Weight: 1}, {Key: "b", Weight: 2}, {Key: "c", Weight: 3}}}}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	per := map[int]int{}
	for _, o := range r.owners {
		per[o]++
	}
	// scale ≈ ceil(1024/6)·6 = 1026 entries: 171, 342, 513, each within one (the weights are
	// fixed-point fractions, the running sums floats).
	for i, want := range []int{171, 342, 513} {
		if d := per[i] - want; d < -1 || d > 1 {
			t.Errorf("endpoint %d has %d entries, want %d±1", i, per[i], want)
		}
	}
}

// TestPick: the first entry whose hash is ≥ the request hash, wrapping; entries of an endpoint
// hash its key with "_<n>"; skipped endpoints are never picked and indices are the input's.
func TestPick(t *testing.T) {
	locs := []Locality{
		{Weight: 1, Endpoints: []Endpoint{{Key: "10.0.0.1:80", Skip: true}, {Key: "10.0.0.2:80"}}},
		{Weight: 1, Endpoints: []Endpoint{{Key: "10.0.0.3:80"}}},
	}
	r, err := New(locs, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	first, last := r.owners[0], r.owners[len(r.owners)-1]
	if got := r.Pick(0); got != first {
		t.Errorf("Pick(0) = %d, want the first entry's %d", got, first)
	}
	if got := r.Pick(r.hashes[len(r.hashes)-1] + 1); got != first {
		t.Errorf("above the last entry: %d, want the first entry's %d (wrap)", got, first)
	}
	if got := r.Pick(r.hashes[len(r.hashes)-1]); got != last {
		t.Errorf("the last entry's own hash: %d, want %d", got, last)
	}
	entry := xxhash.Sum64String("10.0.0.3:80_5")
	if got := r.Pick(entry); got != 2 || r.Key(got) != "10.0.0.3:80" {
		t.Errorf("Pick(hash of entry 5 of 10.0.0.3:80) = %d (%s), want 2", got, r.Key(got))
	}
	for i := range 10000 {
		h, _ := RequestHash("x", []string{fmt.Sprint(i)})
		if r.Pick(h) == 0 {
			t.Fatal("a skipped endpoint was picked")
		}
	}
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		locs     []Locality
		min, max uint64
	}{
		{"no endpoint", nil, 0, 0},
		{"every endpoint skipped", []Locality{{Weight: 1, Endpoints: []Endpoint{{Key: "a", Skip: true}}}}, 0, 0},
		{"duplicate key", []Locality{{Weight: 1, Endpoints: []Endpoint{{Key: "a"}}}, {Weight: 1, Endpoints: []Endpoint{{Key: "a"}}}}, 0, 0},
		{"min above max", []Locality{{Weight: 1, Endpoints: []Endpoint{{Key: "a"}}}}, 2000, 1000},
		{"locality weights overflow", []Locality{{Weight: math.MaxUint32, Endpoints: []Endpoint{{Key: "a"}}}, {Weight: 1, Endpoints: []Endpoint{{Key: "b"}}}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.locs, tc.min, tc.max); !errors.Is(err, ErrInvalid) {
				t.Errorf("New: %v, want ErrInvalid", err)
			}
		})
	}
}

// TestRemovingAnEndpointMovesOtherKeys measures what a drain does to a gRPC client's ring when
// the draining endpoint leaves it (tether's EDS marks it DRAINING): every key of that endpoint
// moves, and — since grpc-go rescales the ring to its size, giving each remaining endpoint more
// entries — some keys of the other endpoints move too. An unchanged endpoint set moves none.
func TestRemovingAnEndpointMovesOtherKeys(t *testing.T) {
	const keys = 20000
	for _, n := range []int{2, 3, 4, 5, 8, 16} {
		all := Locality{Weight: uint32(n)}
		for i := range n {
			all.Endpoints = append(all.Endpoints, Endpoint{Key: fmt.Sprintf("10.0.0.%d:8080", i+1), Weight: 1})
		}
		drained := Locality{Weight: uint32(n), Endpoints: slices.Clone(all.Endpoints)}
		drained.Endpoints[0].Skip = true
		before, err := New([]Locality{all}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		same, err := New([]Locality{all}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		after, err := New([]Locality{drained}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		onDrained, others, movedOthers, movedSame := 0, 0, 0, 0
		for k := range keys {
			h, _ := RequestHash("x-tether-session", []string{fmt.Sprintf("session-%d", k)})
			b, a := before.Pick(h), after.Pick(h)
			if same.Pick(h) != b {
				movedSame++
			}
			if b == 0 {
				onDrained++
				if a == 0 {
					t.Fatalf("n=%d: a key stayed on the drained endpoint", n)
				}
				continue
			}
			others++
			if a != b {
				movedOthers++
			}
		}
		if movedSame != 0 {
			t.Errorf("n=%d: %d keys moved on an unchanged ring", n, movedSame)
		}
		t.Logf("n=%d: %d of %d keys on the drained endpoint (%.1f %%) moved; of the other %d keys %d moved (%.1f %%)",
			n, onDrained, keys, 100*float64(onDrained)/keys, others, movedOthers, 100*float64(movedOthers)/float64(others))
	}
}
