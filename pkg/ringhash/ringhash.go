// Package ringhash is a mirror of the ring that a proxyless grpc-go client (v1.85) builds for an
// xDS cluster balanced with ring_hash, and of the request hash its xDS resolver computes from a
// route's header hash policy — so that tether can know which endpoint such a client sends a
// call to, and count the call there. It reproduces grpc-go's results; it shares no code with it.
//
// # What it mirrors (grpc-go 1.85)
//
//   - Endpoint weights (internal/xds/balancer/cdsbalancer configbuilder,
//     priorityLocalitiesToEndpoints, with gRFC A113's GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING on,
//     its default): within one priority, each endpoint's weight is its share of its locality's
//     endpoint-weight sum times its locality's share of the priority's locality-weight sum, both
//     as UQ1.31 fixed-point fractions, multiplied in fixed point, and at least 1. The locality's
//     endpoint-weight sum counts every endpoint the EDS resource lists, also those the ring then
//     leaves out (Endpoint.Skip). Localities of weight 0 are ignored (xdsresource's EDS parser).
//   - Which endpoints are on the ring: those whose EDS health status is HEALTHY or UNKNOWN; the
//     others (DRAINING, UNHEALTHY, …) are left out (Endpoint.Skip).
//   - Ring construction (balancer/ringhash newRing, normalizeWeights): the weights normalized to
//     their sum; endpoints ordered by hash key; scale = min(ceil(minWeight·minRingSize)/minWeight,
//     maxRingSize); walking the endpoints, entries are added while the running count is below the
//     running sum of scale·weight, entry i of an endpoint hashing XXH64(hashKey + "_" + i); the
//     entries sorted by hash. The hash key is the endpoint's envoy.lb hash_key metadata when set,
//     else its first address as "ip:port" (tether's xDS sets no hash_key: the address).
//   - Ring sizes (balancer/ringhash parseConfig): 0 means the default (min 1024, max 4096); both
//     are capped at 4096, grpc-go's default GRPC_RING_HASH_CAP.
//   - The request hash (internal/xds/resolver configSelector.generateHash) of one header hash
//     policy: the call's outgoing metadata values of the header, in order, joined with ",", hashed
//     with XXH64; no hash when the header is absent or ends in "-bin". With one policy the
//     rotate-and-xor combination is the policy's hash itself.
//   - The pick (balancer/ringhash ring.pick): the first entry whose hash is ≥ the request hash,
//     wrapping to the first entry.
//
// # Where a client can differ
//
//   - Connectivity: grpc-go's picker skips endpoints in TRANSIENT_FAILURE and walks the ring to
//     the next entry that is READY, CONNECTING or IDLE (gRFC A61); tether cannot see a client's
//     connections, so the mirror is the pick of a client whose endpoints are all reachable.
//   - No header: grpc-go then hashes at random (and walks to the first READY endpoint); no mirror
//     can know that pick (RequestHash reports false).
//   - Priorities: grpc-go fails over to the next priority when the current one's child is not
//     READY (or has no endpoint); the caller chooses the priority it mirrors (tether: the first
//     one with an endpoint on the ring).
//   - A client started with GRPC_RING_HASH_CAP, GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING=false or
//     GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT, another grpc-go version, or another gRPC
//     language may build another ring. A hash policy with a regex rewrite, several policies or a
//     channel-id policy are not mirrored (tether's xDS sends one plain header policy).
package ringhash

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

const (
	// MinRingSize is grpc-go's default minimum ring size, and the minimum_ring_size tether's
	// xDS sets on the ring_hash clusters of gRPC clients.
	MinRingSize = 1024
	// MaxRingSize is grpc-go's default maximum ring size and its default cap on both sizes
	// (GRPC_RING_HASH_CAP), and the maximum_ring_size tether's xDS sets.
	MaxRingSize = 4096
)

// ErrInvalid is wrapped by New's errors.
var ErrInvalid = errors.New("ringhash: invalid ring")

// Endpoint is one endpoint of an EDS locality as grpc-go reads it.
type Endpoint struct {
	// Key is the endpoint's hash key: its envoy.lb hash_key metadata, else its first address
	// as net.JoinHostPort(ip, port).
	Key string
	// Weight is the endpoint's load_balancing_weight (0 counts as 1, as an unset weight).
	Weight uint32
	// Skip marks an endpoint whose health status is neither HEALTHY nor UNKNOWN: its weight
	// still counts in its locality's sum, but it is not on the ring.
	Skip bool
}

// Locality is one locality of the priority being mirrored.
type Locality struct {
	// Weight is the locality's load_balancing_weight; a locality of weight 0 is ignored.
	Weight    uint32
	Endpoints []Endpoint
}

// Ring is an immutable ring. Its picks name endpoints by their index in the flattened input:
// the endpoints of the first locality, then of the second, and so on (skipped ones and those
// of ignored localities included).
type Ring struct {
	hashes []uint64 // sorted
	owners []int    // owners[i]: the endpoint of entry i
	keys   []string // by endpoint index
}

// fixedPointBits is the number of fractional bits of gRFC A113's UQ1.31 weights.
const fixedPointBits = 31

func fraction(num, den uint64) uint32 { return uint32(num << fixedPointBits / den) }

func fixedMul(a, b uint32) uint32 { return uint32(uint64(a) * uint64(b) >> fixedPointBits) }

// ringEndpoint is an endpoint on the ring with its grpc-go weight.
type ringEndpoint struct {
	key    string
	weight uint32
	index  int
}

// New builds the ring grpc-go builds from the localities of one priority, with the cluster's
// ring sizes (0: grpc-go's defaults; both capped at MaxRingSize). It fails when no endpoint is
// on the ring, when two endpoints share a key (grpc-go refuses the EDS resource), when a
// priority's locality weights or a locality's endpoint weights overflow uint32, or when
// minSize > maxSize.
func New(localities []Locality, minSize, maxSize uint64) (*Ring, error) {
	minSize, maxSize, err := sizes(minSize, maxSize)
	if err != nil {
		return nil, err
	}
	eps, keys, err := weighted(localities)
	if err != nil {
		return nil, err
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("%w: no endpoint is on the ring", ErrInvalid)
	}
	var sum uint32
	for _, ep := range eps {
		sum += ep.weight
	}
	slices.SortFunc(eps, func(a, b ringEndpoint) int { return strings.Compare(a.key, b.key) })
	minWeight := 1.0
	norm := make([]float64, len(eps))
	for i, ep := range eps {
		norm[i] = float64(ep.weight) / float64(sum)
		minWeight = math.Min(minWeight, norm[i])
	}
	scale := math.Min(math.Ceil(minWeight*float64(minSize))/minWeight, float64(maxSize))
	type entry struct {
		hash  uint64
		owner int
	}
	entries := make([]entry, 0, int(math.Ceil(scale)))
	var current, target float64
	for i, ep := range eps {
		target += scale * norm[i]
		for n := 0; current < target; n++ {
			entries = append(entries, entry{xxhash.Sum64String(ep.key + "_" + strconv.Itoa(n)), ep.index})
			current++
		}
	}
	slices.SortFunc(entries, func(a, b entry) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	})
	r := &Ring{hashes: make([]uint64, len(entries)), owners: make([]int, len(entries)), keys: keys}
	for i, e := range entries {
		r.hashes[i], r.owners[i] = e.hash, e.owner
	}
	return r, nil
}

// sizes applies grpc-go's defaults and cap to a cluster's ring sizes.
func sizes(minSize, maxSize uint64) (uint64, uint64, error) {
	if minSize == 0 {
		minSize = MinRingSize
	}
	if maxSize == 0 {
		maxSize = MaxRingSize
	}
	if minSize > maxSize {
		return 0, 0, fmt.Errorf("%w: minimum ring size %d above maximum %d", ErrInvalid, minSize, maxSize)
	}
	return min(minSize, MaxRingSize), min(maxSize, MaxRingSize), nil
}

// weighted returns the endpoints on the ring with their grpc-go weights (gRFC A113), and every
// endpoint's key by flattened index.
func weighted(localities []Locality) ([]ringEndpoint, []string, error) {
	var locSum uint64
	for _, l := range localities {
		locSum += uint64(l.Weight)
	}
	if locSum > math.MaxUint32 {
		return nil, nil, fmt.Errorf("%w: locality weights sum to %d, above 2^32-1", ErrInvalid, locSum)
	}
	var (
		eps  []ringEndpoint
		keys []string
		seen = map[string]bool{}
	)
	for _, l := range localities {
		var epSum uint64
		for _, ep := range l.Endpoints {
			epSum += uint64(max(ep.Weight, 1))
		}
		if epSum > math.MaxUint32 {
			return nil, nil, fmt.Errorf("%w: endpoint weights of a locality sum to %d, above 2^32-1", ErrInvalid, epSum)
		}
		for _, ep := range l.Endpoints {
			idx := len(keys)
			keys = append(keys, ep.Key)
			if seen[ep.Key] {
				return nil, nil, fmt.Errorf("%w: two endpoints with key %q", ErrInvalid, ep.Key)
			}
			seen[ep.Key] = true
			if l.Weight == 0 || ep.Skip {
				continue
			}
			w := fixedMul(fraction(uint64(max(ep.Weight, 1)), epSum), fraction(uint64(l.Weight), locSum))
			eps = append(eps, ringEndpoint{key: ep.Key, weight: max(w, 1), index: idx})
		}
	}
	return eps, keys, nil
}

// Pick returns the index (in the flattened input, see Ring) of the endpoint a request with
// hash h reaches: the first entry whose hash is ≥ h, else the first entry.
func (r *Ring) Pick(h uint64) int {
	i, _ := slices.BinarySearch(r.hashes, h)
	if i == len(r.hashes) {
		i = 0
	}
	return r.owners[i]
}

// Key returns the key of endpoint i (an index in the flattened input).
func (r *Ring) Key(i int) string { return r.keys[i] }

// Size returns the number of entries on the ring.
func (r *Ring) Size() int { return len(r.hashes) }

// RequestHash returns the hash grpc-go's xDS resolver computes for a route whose one hash
// policy hashes header, from the call's values of that header in order: XXH64 of the values
// joined with ",". ok is false when grpc-go computes no hash from the policy — the header is
// absent, or its name ends in "-bin" — and then hashes the call at random.
func RequestHash(header string, values []string) (h uint64, ok bool) {
	if len(values) == 0 || strings.HasSuffix(header, "-bin") {
		return 0, false
	}
	return xxhash.Sum64String(strings.Join(values, ",")), true
}
