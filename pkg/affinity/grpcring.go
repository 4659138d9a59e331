package affinity

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync/atomic"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/ringhash"
	"github.com/tether-dev/tether/pkg/wire"
)

// grpcRing is the ring a proxyless gRPC client builds from the endpoints tether's xDS serves
// it for one service, and which instance each of its endpoints is.
type grpcRing struct {
	ring *ringhash.Ring // nil: no endpoint is on the ring
	inst []int          // ring endpoint index → index in svcState.insts
	// pinned caches, by instance index, the service limited to that instance (built on first
	// use), so a call allocates no per-request copy.
	pinned []atomic.Pointer[svcState]
}

// buildGRPCRing mirrors, for a service's instances, what a gRPC client makes of the
// ClusterLoadAssignment pkg/xds serves it (xds.ClusterLoadAssignment): instances that are
// healthy (or not checked) and have an HTTP port, sorted by id, one per ip:port (the smallest
// id); standby instances in priority 1 when any other instance is carried; one locality per
// (priority, zone) weighing the sum of its endpoints' weights (minimum 1 each); draining
// instances carried as DRAINING, which gRPC leaves off the ring (ringhash.Endpoint.Skip). The
// ring is that of the first priority with an endpoint on it — the one a client whose
// endpoints are all reachable uses.
func buildGRPCRing(insts []registry.Instance) *grpcRing {
	order := make([]int, 0, len(insts))
	for i, in := range insts {
		if in.Healthy() && in.HTTPPort > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(insts[a].ID, insts[b].ID) })
	seen := make(map[string]bool, len(order))
	order = slices.DeleteFunc(order, func(i int) bool {
		addr := insts[i].HTTPAddr()
		if seen[addr] {
			return true
		}
		seen[addr] = true
		return false
	})
	hasPrimary := slices.ContainsFunc(order, func(i int) bool { return insts[i].State != registry.StateStandby })
	type group struct {
		loc  ringhash.Locality
		inst []int
		sum  uint64
	}
	var prio [2]map[string]*group // by zone
	for _, i := range order {
		in := insts[i]
		p := 0
		if in.State == registry.StateStandby && hasPrimary {
			p = 1
		}
		if prio[p] == nil {
			prio[p] = map[string]*group{}
		}
		g := prio[p][in.Zone]
		if g == nil {
			g = &group{}
			prio[p][in.Zone] = g
		}
		w := max(in.Weight, 1)
		g.loc.Endpoints = append(g.loc.Endpoints, ringhash.Endpoint{Key: in.HTTPAddr(), Weight: w, Skip: in.State == registry.StateDraining})
		g.inst = append(g.inst, i)
		g.sum += uint64(w)
	}
	for _, groups := range prio {
		var (
			locs []ringhash.Locality
			inst []int
			on   bool
		)
		for _, zone := range slices.Sorted(maps.Keys(groups)) {
			g := groups[zone]
			g.loc.Weight = uint32(min(g.sum, math.MaxUint32))
			locs = append(locs, g.loc)
			inst = append(inst, g.inst...)
			on = on || slices.ContainsFunc(g.loc.Endpoints, func(e ringhash.Endpoint) bool { return !e.Skip })
		}
		if !on {
			continue
		}
		r, err := ringhash.New(locs, ringhash.MinRingSize, ringhash.MaxRingSize)
		if err != nil {
			return &grpcRing{} // e.g. weights a gRPC client refuses too: no mirror
		}
		return &grpcRing{ring: r, inst: inst, pinned: make([]atomic.Pointer[svcState], len(insts))}
	}
	return &grpcRing{}
}

// grpcHeader is the header a gRPC client's route hashes for the service (pkg/xds).
func (st *svcState) grpcHeader() string {
	if st.svc.HeaderField != "" {
		return st.svc.HeaderField
	}
	return wire.DefaultSessionHeader
}

// grpcPick returns the index of the instance a proxyless gRPC client sends the request to, by
// the mirror of its ring; ok is false when that cannot be known: the request has no value of
// the hashed header (the client hashes it at random) or no endpoint is on the ring.
func (st *svcState) grpcPick(req *Request) (int, bool) {
	gr := st.grpc()
	if gr.ring == nil {
		return -1, false
	}
	header := st.grpcHeader()
	var buf [2]string
	values := buf[:0]
	for i := 0; ; i++ {
		v, ok := headerValue(req.Headers, req.HeaderSource, header, i)
		if !ok {
			break
		}
		values = append(values, v)
	}
	h, ok := ringhash.RequestHash(header, values)
	if !ok {
		return -1, false
	}
	return gr.inst[gr.ring.Pick(h)], true
}

// GRPCRingLookup returns the instance a proxyless gRPC client configured by tether's xDS sends
// a call to whose session header (the service's HeaderField, default
// wire.DefaultSessionHeader) is key: the pick of the mirror of the client's ring (package
// ringhash) over the endpoints tether serves it. It takes no slot. ErrUnknownService for an
// unknown service; a ClassNoCapacity *Reject when no endpoint is on the ring.
func (e *Engine) GRPCRingLookup(ctx context.Context, service, key string) (registry.Instance, error) {
	st, err := e.knownService(ctx, service)
	if err != nil {
		return registry.Instance{}, err
	}
	idx, ok := st.grpcPick(&Request{Headers: map[string][]string{st.grpcHeader(): {key}}})
	if !ok {
		return registry.Instance{}, e.reject(ClassNoCapacity, "NoCapacity", fmt.Sprintf("service %q has no endpoint on a gRPC client's ring", service))
	}
	return st.insts[idx], nil
}

// pinnedToGRPCPick returns st limited to the instance a proxyless gRPC client sends req to
// (grpcPick), so the mode decides — counts, admits or refuses — on that instance alone; st
// itself when the pick cannot be known (tether's placement decides, as for any request) or
// the picked instance cannot serve (the mode then refuses or places as it would). st must be
// a view's own svcState, not a per-request copy: the limited copies are cached in its ring
// and shared by every request of the generation (at most one per instance).
func (st *svcState) pinnedToGRPCPick(req *Request) *svcState {
	idx, ok := st.grpcPick(req)
	if !ok {
		return st
	}
	cache := &st.grpc().pinned[idx]
	r := cache.Load()
	if r == nil {
		in := make([]bool, len(st.insts))
		in[idx] = true
		if r, ok = st.masked(in); !ok {
			return st
		}
		r.pinned = idx
		if !cache.CompareAndSwap(nil, r) {
			r = cache.Load()
		}
	}
	if r.dcr.Load() == nil { // a DCR file that loaded after the copy was made
		if w := st.dcr.Load(); w != nil {
			r.dcr.Store(w)
		}
	}
	return r
}
