package affinity

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// view is the engine's compiled form of one registry generation. Immutable once published,
// except for the counters it points to.
type view struct {
	gen      uint64
	services map[string]*svcState
	// matchers is every service in resolution order: services naming authorities first, then
	// longer path prefixes first, then by name.
	matchers []*svcState
}

// svcState is one service in a view.
type svcState struct {
	svc   registry.Service // normalized
	insts []registry.Instance
	slots []*balance.Slots // parallel to insts
	// streams counts long-lived MCP streams, parallel to insts; nil when the service counts
	// them as requests (StreamsPerInstance 0).
	streams []*balance.Slots
	byID    map[string]int
	ids     []string
	wts     []uint32

	// HTTP (every session-based mode is HTTP only): the instance has an HTTP port and is
	placeable []bool // healthy and active: may take new sessions and sessionless requests
	routable  []bool // healthy and not standby: may serve existing sessions
	standby   []bool // healthy standby: may take a new session on scale-out
	// sipPlaceable: healthy and active with a SIP port: may take SIP decisions.
	sipPlaceable []bool

	hosts  []string // lower-case authorities; empty = any
	prefix string

	dcr    atomic.Pointer[dcr.Watcher] // hash services with a DCR file; nil until it loads
	maglev *balance.Maglev             // hash affinity and consistent-hash balancing; nil without instances
	rr     *balance.RoundRobin
	lr     *balance.LeastRequest
	mode   *mode

	// grpc is the mirror of a proxyless gRPC client's ring over the instances, built on first
	// use in each generation (grpcring.go).
	grpc func() *grpcRing
	// pinned is the index of the one instance a per-request copy is limited to because a
	// gRPC client's ring sends the request there (pinnedToGRPCPick); -1 otherwise.
	pinned int

	// Closures built once per generation so the hot path allocates none, by protocol.
	placeFn [protoCount]func(int) bool // placeable (HTTP) or sipPlaceable (SIP)
	freeFn  [protoCount]func(int) bool // the same with a free request slot
	loadFn  func(int) int              // requests in flight
}

// normalized gives a registry service's zero values their meaning: no affinity, round-robin
// balancing (consistent-hash for hash affinity), and a lower-case header field. Every other
// default belongs to pkg/config (config.DefaultService for services built in code); the engine
// takes caps, TTLs and names as given.
func normalized(s registry.Service) registry.Service {
	if s.Affinity == "" {
		s.Affinity = registry.AffinityNone
	}
	if s.Balancing == "" {
		s.Balancing = registry.BalanceRoundRobin
		if s.Affinity == registry.AffinityHash {
			s.Balancing = registry.BalanceConsistentHash
		}
	}
	s.HeaderField = strings.ToLower(s.HeaderField)
	return s
}

// rebuildLocked compiles snap into a new view and publishes it. e.mu must be held.
func (e *Engine) rebuildLocked(ctx context.Context, snap *registry.Snapshot) (*view, error) {
	old := e.view.Load()
	v := &view{gen: snap.Generation, services: map[string]*svcState{}}
	present := map[registry.Key]bool{}
	for _, raw := range snap.Services() {
		svc := normalized(raw)
		var prev *svcState
		if old != nil {
			prev = old.services[svc.Name]
		}
		st, err := e.compileServiceLocked(ctx, svc, snap.Instances(svc.Name), prev, present)
		if err != nil {
			return nil, err
		}
		v.services[svc.Name] = st
		v.matchers = append(v.matchers, st)
	}
	slices.SortFunc(v.matchers, matcherOrder)
	e.forgetRemovedLocked(present)
	e.view.Store(v)
	next := make(chan struct{})
	close(*e.applied.Swap(&next)) // wake Sync
	return v, nil
}

// compileServiceLocked builds svc's state over insts, carrying over from prev (the service's
// state in the current view, or nil) the balancers' positions and a hash table that still
// fits. It marks every instance's key in present. e.mu must be held.
func (e *Engine) compileServiceLocked(ctx context.Context, svc registry.Service, insts []registry.Instance, prev *svcState, present map[registry.Key]bool) (*svcState, error) {
	st := newSvcState(svc, insts)
	for i, in := range insts {
		present[in.Key()] = true
		st.setInstance(i, in)
		sl, err := e.slotsForLocked(ctx, in.Key(), svc)
		if err != nil {
			return nil, err
		}
		st.slots[i] = sl
		if svc.StreamsPerInstance > 0 {
			if st.streams == nil {
				st.streams = make([]*balance.Slots, len(insts))
			}
			st.streams[i] = e.streamsForLocked(in.Key(), svc.StreamsPerInstance)
		}
	}
	if prev != nil {
		st.rr, st.lr = prev.rr, prev.lr
	} else {
		st.rr, st.lr = balance.NewRoundRobin(), balance.NewLeastRequest()
	}
	if err := st.buildMaglev(prev); err != nil {
		return nil, err
	}
	st.grpc = sync.OnceValue(func() *grpcRing { return buildGRPCRing(insts) })
	st.bindPredicates()
	if st.mode.dcr && svc.DCRFile != "" {
		if w := e.dcrWatcherLocked(svc.DCRFile); w != nil {
			st.dcr.Store(w)
		}
	}
	return st, nil
}

// newSvcState returns svc's state with its per-instance tables sized for insts and its
// authorities lower-cased, host only.
func newSvcState(svc registry.Service, insts []registry.Instance) *svcState {
	st := &svcState{
		svc:       svc,
		insts:     insts,
		slots:     make([]*balance.Slots, len(insts)),
		byID:      make(map[string]int, len(insts)),
		ids:       make([]string, len(insts)),
		wts:       make([]uint32, len(insts)),
		placeable: make([]bool, len(insts)),
		routable:  make([]bool, len(insts)),
		standby:   make([]bool, len(insts)),
		prefix:    svc.Match.PathPrefix,
		mode:      modeFor(svc),
		pinned:    -1,

		sipPlaceable: make([]bool, len(insts)),
	}
	for _, h := range svc.Match.Authorities {
		st.hosts = append(st.hosts, strings.ToLower(hostOnly(h)))
	}
	return st
}

// setInstance fills instance i's id, weight and placement flags.
func (st *svcState) setInstance(i int, in registry.Instance) {
	st.byID[in.ID] = i
	st.ids[i] = in.ID
	st.wts[i] = max(in.Weight, 1)
	http := in.HTTPPort > 0 // a SIP-only instance never takes HTTP (no :0 destination)
	st.placeable[i] = http && in.Placeable()
	st.routable[i] = http && in.Routable()
	st.standby[i] = http && in.Healthy() && in.State == registry.StateStandby
	st.sipPlaceable[i] = in.SIPPort > 0 && in.Placeable()
}

// buildMaglev gives a ring mode or consistent-hash balancing its hash table, reusing prev's
// when the instance ids and weights are unchanged.
func (st *svcState) buildMaglev(prev *svcState) error {
	if (!st.mode.ring && st.svc.Balancing != registry.BalanceConsistentHash) || len(st.insts) == 0 {
		return nil
	}
	if prev != nil && prev.maglev != nil && slices.Equal(prev.ids, st.ids) && slices.Equal(prev.wts, st.wts) {
		st.maglev = prev.maglev
		return nil
	}
	m, err := balance.NewMaglev(st.ids, st.wts)
	if err != nil {
		return fmt.Errorf("affinity: service %q: building the hash table: %w", st.svc.Name, err)
	}
	st.maglev = m
	return nil
}

// bindPredicates sets the per-protocol placement and free-slot predicates and the load
// function over st's tables.
func (st *svcState) bindPredicates() {
	st.placeFn[protoHTTP] = func(i int) bool { return st.placeable[i] }
	st.freeFn[protoHTTP] = func(i int) bool { return st.placeable[i] && st.hasRequestSlot(i) }
	st.placeFn[protoSIP] = func(i int) bool { return st.sipPlaceable[i] }
	st.freeFn[protoSIP] = func(i int) bool { return st.sipPlaceable[i] && st.hasRequestSlot(i) }
	st.loadFn = func(i int) int { return st.slots[i].Requests() }
}

// matcherOrder sorts services for request matching: those with authorities first, then the
// longest path prefix, then by name.
func matcherOrder(a, b *svcState) int {
	if c := boolCmp(len(a.hosts) > 0, len(b.hosts) > 0); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.prefix), len(a.prefix)); c != 0 {
		return c
	}
	return cmp.Compare(a.svc.Name, b.svc.Name)
}

// forgetRemovedLocked drops the counters of instances not in present once nothing counts on
// them any more. e.mu must be held.
func (e *Engine) forgetRemovedLocked(present map[registry.Key]bool) {
	for k, sl := range e.slots {
		if !present[k] && sl.Sessions() == 0 && sl.Requests() == 0 {
			delete(e.slots, k)
		}
	}
	for k, sl := range e.streams {
		if !present[k] && sl.Requests() == 0 {
			delete(e.streams, k)
		}
	}
}

// boolCmp orders true before false.
func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	default:
		return 1
	}
}

// streamsForLocked returns the instance's stream counter with the given cap (its request half
// counts streams). e.mu must be held.
func (e *Engine) streamsForLocked(k registry.Key, limit int) *balance.Slots {
	sl, ok := e.streams[k]
	if !ok {
		sl = balance.NewSlots(1, limit)
		e.streams[k] = sl
	} else if _, c := sl.Caps(); c != limit {
		sl.SetCaps(1, limit)
	}
	return sl
}

// slotsForLocked returns the instance's counters, creating them (and counting the sessions the
// store already binds to the instance, e.g. after a restore) the first time. e.mu must be held.
func (e *Engine) slotsForLocked(ctx context.Context, k registry.Key, svc registry.Service) (*balance.Slots, error) {
	if sl, ok := e.slots[k]; ok {
		if s, r := sl.Caps(); s != svc.SessionsPerInstance || r != svc.RequestSlotsPerInstance {
			sl.SetCaps(svc.SessionsPerInstance, svc.RequestSlotsPerInstance)
		}
		return sl, nil
	}
	// A session that ends after the count below is released on these counters: sessionEnded
	// finds them (it waits for e.mu when the instance is not in the published view yet). A
	// session whose end commits just before the count but is announced after it would be
	// released once too often; this needs sessions bound to an instance the engine holds no
	// counters for, which at run time means none (counters are kept while anything counts on
	// them), and New runs before any end can reach the engine.
	sl := e.newSlots(k, svc)
	e.slots[k] = sl
	if e.slotStore != nil {
		return sl, nil // the store counts the sessions (shared slots)
	}
	n, err := e.countSessions(ctx, k)
	if err != nil {
		delete(e.slots, k)
		return nil, fmt.Errorf("affinity: counting the sessions of %s/%s: %w", k.Service, k.ID, err)
	}
	if n > 0 {
		sl.AddSessions(n)
		e.log.Info("affinity: counted restored sessions", "service", k.Service, "instance", k.ID, "sessions", n)
	}
	return sl, nil
}

// countSessions counts the sessions bound to an instance that hold one of its session slots:
// from the store's per-instance counts when it keeps them (session.InstanceCounter), else by
// listing them.
func (e *Engine) countSessions(ctx context.Context, k registry.Key) (int, error) {
	n := 0
	if c, ok := e.store.(session.InstanceCounter); ok {
		byKind, err := c.CountActiveByInstance(ctx, k.Service, k.ID)
		for kind, m := range byKind {
			if holdsSlot(kind) {
				n += m
			}
		}
		return n, err
	}
	list, err := e.store.ActiveByInstance(ctx, k.Service, k.ID)
	for _, s := range list {
		if holdsSlot(s.Kind) {
			n++
		}
	}
	return n, err
}

func (st *svcState) hasRequestSlot(i int) bool {
	_, c := st.slots[i].Caps()
	return st.slots[i].Requests() < c
}

// restricted returns st limited to the instances whose HTTP endpoint is in subset (see
// Request.Subset): a per-request copy whose placement, routing and hashing see only those
// instances; counters, tables and balancers are shared with st. It rejects with
// ClassNoCapacity when no listed instance is routable.
func (st *svcState) restricted(subset []string) (*svcState, *Reject) {
	in := make([]bool, len(st.insts))
	for i, inst := range st.insts {
		in[i] = slices.Contains(subset, inst.HTTPAddr())
	}
	r, ok := st.masked(in)
	if !ok {
		return nil, &Reject{Class: ClassNoCapacity, Code: "NoEligibleInstance",
			Message: fmt.Sprintf("no instance of service %q in the data plane's subset %v can serve", st.svc.Name, subset)}
	}
	return r, nil
}

// masked returns st limited to the instances i with in[i] (see restricted); ok is false when
// none of them is routable or standby.
func (st *svcState) masked(in []bool) (*svcState, bool) {
	any := false
	for i := range in {
		any = any || in[i] && (st.routable[i] || st.standby[i])
	}
	if !any {
		return nil, false
	}
	mask := func(b []bool) []bool {
		out := make([]bool, len(b))
		for i := range b {
			out[i] = b[i] && in[i]
		}
		return out
	}
	r := &svcState{
		svc: st.svc, insts: st.insts, slots: st.slots, streams: st.streams, byID: st.byID, ids: st.ids, wts: st.wts,
		placeable: mask(st.placeable), routable: mask(st.routable), standby: mask(st.standby),
		sipPlaceable: mask(st.sipPlaceable), hosts: st.hosts, prefix: st.prefix,
		maglev: st.maglev, rr: st.rr, lr: st.lr, mode: st.mode, loadFn: st.loadFn, grpc: st.grpc, pinned: st.pinned,
	}
	if w := st.dcr.Load(); w != nil {
		r.dcr.Store(w)
	}
	r.placeFn[protoHTTP] = func(i int) bool { return r.placeable[i] }
	r.freeFn[protoHTTP] = func(i int) bool { return r.placeable[i] && r.hasRequestSlot(i) }
	r.placeFn[protoSIP] = func(i int) bool { return r.sipPlaceable[i] }
	r.freeFn[protoSIP] = func(i int) bool { return r.sipPlaceable[i] && r.hasRequestSlot(i) }
	return r, true
}

// resolve finds the request's service.
func (v *view) resolve(req *Request) (*svcState, *Reject) {
	if req.Service != "" {
		if st := v.services[req.Service]; st != nil {
			return st, nil
		}
		return nil, &Reject{Class: ClassNoService, Code: "ServiceNotFound", Message: fmt.Sprintf("service %q does not exist", req.Service)}
	}
	if req.Protocol == ProtocolSIP {
		return nil, &Reject{Class: ClassNoService, Code: "ServiceNotFound", Message: "a SIP request must name its service"}
	}
	host := hostOnly(req.Authority)
	path := req.Path
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for _, st := range v.matchers {
		if !strings.HasPrefix(path, st.prefix) {
			continue
		}
		if len(st.hosts) == 0 {
			return st, nil
		}
		for _, h := range st.hosts {
			if strings.EqualFold(h, host) {
				return st, nil
			}
		}
	}
	return nil, &Reject{Class: ClassNoService, Code: "ServiceNotFound", Message: fmt.Sprintf("no service matches host %q path %q", host, path)}
}

// hostOnly strips the port (and IPv6 brackets) from an authority.
func hostOnly(a string) string {
	if strings.HasPrefix(a, "[") {
		if i := strings.IndexByte(a, ']'); i > 0 {
			return a[1:i]
		}
		return a
	}
	if i := strings.LastIndexByte(a, ':'); i >= 0 && strings.IndexByte(a, ':') == i {
		return a[:i]
	}
	return a
}

// proto indexes per-protocol state.
type proto uint8

const (
	protoHTTP proto = iota
	protoSIP
	protoCount
)

func (p proto) String() string {
	if p == protoSIP {
		return "SIP"
	}
	return "HTTP"
}

func protoOf(req *Request) proto {
	if req.Protocol == ProtocolSIP {
		return protoSIP
	}
	return protoHTTP
}
