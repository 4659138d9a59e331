package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// errRetry makes a mode start its decision over (a concurrent request changed the session).
var errRetry = errors.New("session changed concurrently")

// maxAttempts bounds how often a decision restarts after losing a race on one session.
const maxAttempts = 4

// candidate describes instance i for balance.Place. Only instances with a free request slot
// take new sessions.
func (st *svcState) candidate(i int) balance.Candidate {
	sl := st.slots[i]
	free := st.hasRequestSlot(i)
	capS, _ := sl.Caps()
	return balance.Candidate{
		Active:     st.placeable[i] && free,
		Standby:    st.standby[i] && free,
		Sessions:   sl.Sessions(),
		SessionCap: capS,
	}
}

// placeSession chooses the instance of a new session and takes a session slot on it, plus a
// request slot when withRequest. It signals scale-out when the session opened a standby
// instance (every active instance being full).
func (e *Engine) placeSession(ctx context.Context, st *svcState, withRequest bool) (int, *balance.Ticket, *Reject) {
	return e.placeSessionExcept(ctx, st, withRequest, -1)
}

// placeSessionExcept is placeSession never choosing instance index except (-1: none): a rebind
// excludes the session's own instance, so the session is never counted against the slot it
// already holds there.
func (e *Engine) placeSessionExcept(ctx context.Context, st *svcState, withRequest bool, except int) (int, *balance.Ticket, *Reject) {
	n := len(st.insts)
	if n == 0 {
		return -1, nil, e.reject(ClassNoCapacity, "NoCapacity", fmt.Sprintf("service %q has no instances", st.svc.Name))
	}
	var buf [16]balance.Candidate
	c := buf[:0]
	if n > len(buf) {
		c = make([]balance.Candidate, 0, n)
	}
	for i := range n {
		if i == except {
			c = append(c, balance.Candidate{})
			continue
		}
		c = append(c, st.candidate(i))
	}
	for range 2*n + 1 {
		idx, scaleOut, ok := balance.Place(c)
		if !ok {
			break
		}
		sl := st.slots[idx]
		if !sl.TryAcquireSession() {
			c[idx] = balance.Candidate{} // lost a race for its last slot
			continue
		}
		var t *balance.Ticket
		if withRequest {
			if t, ok = sl.TryAcquireRequest(ctx); !ok {
				sl.ReleaseSession()
				c[idx] = balance.Candidate{}
				continue
			}
		}
		// Scale-out is the moment a standby instance is opened (its first session); later
		// sessions filling the same instance are ordinary placements.
		if scaleOut && c[idx].Sessions == 0 {
			e.signalScaleOut(st, idx)
		}
		return idx, t, nil
	}
	return -1, nil, e.reject(ClassNoCapacity, "NoCapacity",
		fmt.Sprintf("no instance of service %q can take a new session: every healthy instance is full", st.svc.Name))
}

func (e *Engine) signalScaleOut(st *svcState, idx int) {
	so := ScaleOut{Service: st.svc.Name, Instance: st.insts[idx], Desired: st.desired()}
	e.log.Info("affinity: scale-out: every active instance is full; placed the session on a standby instance",
		"service", so.Service, "instance", so.Instance.ID, "desired", so.Desired)
	if e.scaleOut != nil {
		e.scaleOut(so)
	}
}

// desired is the number of instances the service wants: those holding sessions, plus one when
// every instance in use is full. In use are the active instances and the standby instances
// that already took sessions by scale-out (they stand for the instances an autoscaler adds).
func (st *svcState) desired() int {
	n, allFull := 0, true
	for i, sl := range st.slots {
		s := sl.Sessions()
		if s > 0 {
			n++
		}
		if st.placeable[i] || st.standby[i] && s > 0 {
			if c, _ := sl.Caps(); s < c {
				allFull = false
			}
		}
	}
	if allFull {
		n++
	}
	return n
}

// admit takes a request slot on the instance of an existing session.
func (e *Engine) admit(ctx context.Context, st *svcState, idx int) (*balance.Ticket, *Reject) {
	if t, ok := st.slots[idx].TryAcquireRequest(ctx); ok {
		return t, nil
	}
	_, c := st.slots[idx].Caps()
	return nil, e.reject(ClassTooManyRequests, "ResourceExhausted",
		fmt.Sprintf("instance %q of service %q has all %d request slots in use", st.ids[idx], st.svc.Name, c))
}

// isStream reports whether an MCP request opens a long-lived stream that counts against the
// service's stream slots: a GET (the SSE stream of a Streamable HTTP session, or the HTTP+SSE
// GET), or a subscriptions/listen POST (Mcp-Method, MCP 2026-07-28).
func isStream(req *Request) bool {
	return req.Method == "GET" || req.Method == "POST" && req.Header("mcp-method") == "subscriptions/listen"
}

// admitFor takes the slot a request needs on instance idx: a stream slot for a stream on a
// service with stream slots, else a request slot.
func (e *Engine) admitFor(ctx context.Context, st *svcState, idx int, stream bool) (*balance.Ticket, *Reject) {
	if !stream || st.streams == nil {
		return e.admit(ctx, st, idx)
	}
	if t, ok := st.streams[idx].TryAcquireRequest(ctx); ok {
		return t, nil
	}
	_, c := st.streams[idx].Caps()
	return nil, e.reject(ClassTooManyRequests, "StreamSlotsExhausted",
		fmt.Sprintf("instance %q of service %q has all %d stream slots in use (long-lived MCP streams)", st.ids[idx], st.svc.Name, c))
}

// freeStream places a stream that belongs to no session (a sessionless subscriptions/listen)
// on a placeable instance with a free stream slot, round robin.
func (e *Engine) freeStream(ctx context.Context, st *svcState, now time.Time) (*decision, error) {
	free := func(i int) bool {
		if !st.placeable[i] {
			return false
		}
		_, c := st.streams[i].Caps()
		return st.streams[i].Requests() < c
	}
	for range len(st.insts) + 1 {
		idx, ok := st.rr.Pick(st.wts, free)
		if !ok {
			break
		}
		if t, ok := st.streams[idx].TryAcquireRequest(ctx); ok {
			d := e.newDecision(st, idx, t, "", false, now)
			d.stream.Store(true)
			return d, nil
		}
	}
	return nil, e.reject(ClassTooManyRequests, "StreamSlotsExhausted",
		fmt.Sprintf("no instance of service %q has a free stream slot", st.svc.Name))
}

// pickFree chooses an instance for a request that belongs to no session, with the given
// algorithm, among the healthy active instances with the protocol's port and a free request
// slot, and takes a request slot.
func (e *Engine) pickFree(ctx context.Context, st *svcState, p proto, algo registry.Balancing, key string) (int, *balance.Ticket, *Reject) {
	free := st.freeFn[p]
	if i := st.pinned; i >= 0 {
		// Limited to a gRPC client's ring pick: no balancing to do.
		if free(i) {
			if t, ok := st.slots[i].TryAcquireRequest(ctx); ok {
				return i, t, nil
			}
		}
		return e.pinnedRefusal(st, p)
	}
	for range len(st.insts) + 1 {
		var idx int
		var ok bool
		switch algo {
		case registry.BalanceLeastRequest:
			idx, ok = st.lr.Pick(st.wts, st.loadFn, free)
		case registry.BalanceConsistentHash:
			if st.maglev != nil {
				idx, ok = st.lookup(balance.Hash(key), free)
			}
		default:
			idx, ok = st.rr.Pick(st.wts, free)
		}
		if !ok {
			break
		}
		if t, ok := st.slots[idx].TryAcquireRequest(ctx); ok {
			return idx, t, nil
		}
	}
	for i := range st.insts {
		if st.placeFn[p](i) {
			return -1, nil, e.reject(ClassTooManyRequests, "ResourceExhausted",
				fmt.Sprintf("every instance of service %q has all its request slots in use", st.svc.Name))
		}
	}
	return -1, nil, e.reject(ClassNoCapacity, "NoCapacity", fmt.Sprintf("service %q has no healthy active instance with a %s port", st.svc.Name, p))
}

// pinnedRefusal refuses a request limited to a gRPC client's ring pick (svcState.pinned) that
// the instance cannot take: ResourceExhausted naming it when its request slots are full,
// NoCapacity when it takes no sessionless requests (draining, standby).
func (e *Engine) pinnedRefusal(st *svcState, p proto) (int, *balance.Ticket, *Reject) {
	i := st.pinned
	if st.placeFn[p](i) {
		_, c := st.slots[i].Caps()
		return -1, nil, e.reject(ClassTooManyRequests, "ResourceExhausted",
			fmt.Sprintf("instance %q of service %q, where the gRPC client's ring sends the call, has all %d request slots in use", st.ids[i], st.svc.Name, c))
	}
	return -1, nil, e.reject(ClassNoCapacity, "NoCapacity",
		fmt.Sprintf("instance %q of service %q, where the gRPC client's ring sends the call, takes no new requests (%s)", st.ids[i], st.svc.Name, st.insts[i].State))
}

// lookup finds a key's instance on the service's Maglev table, bounded when configured.
func (st *svcState) lookup(h uint64, usable func(int) bool) (int, bool) {
	if st.svc.HashBalanceFactor >= 1 {
		return st.maglev.LookupBounded(h, usable, st.loadFn, st.svc.HashBalanceFactor)
	}
	return st.maglev.Lookup(h, usable)
}

// createClaimedSession is createSession for a request that opens a session under peer's
// client limits (admitNewSession): the client's claim binds to the new session, or is released
// when it is refused.
func (e *Engine) createClaimedSession(ctx context.Context, st *svcState, id, peer string, kind session.Kind, now time.Time) (*decision, error) {
	claim, rej := e.admitNewSession(ctx, st, peer, now)
	if rej != nil {
		return nil, rej
	}
	d, err := e.createSession(ctx, st, id, kind, now)
	if err != nil {
		claim.release()
		return nil, err
	}
	claim.bind(d.sessionID)
	return d, nil
}

// createSession places a new session (with a request slot) and stores it. id "" generates one.
// A session.ErrExists error means a concurrent request created the same id first.
func (e *Engine) createSession(ctx context.Context, st *svcState, id string, kind session.Kind, now time.Time) (*decision, error) {
	if e.slotStore != nil {
		return e.createShared(ctx, st, id, kind, now)
	}
	idx, t, rej := e.placeSession(ctx, st, true)
	if rej != nil {
		return nil, rej
	}
	if id == "" {
		var err error
		if id, err = session.NewID(); err != nil {
			st.slots[idx].ReleaseSession()
			t.Release()
			return nil, fmt.Errorf("affinity: generating a session id: %w", err)
		}
	}
	rec := e.newRecord(st, id, idx, kind, now)
	e.markProvisional(st, &rec)
	if err := e.store.Create(ctx, rec); err != nil {
		st.slots[idx].ReleaseSession()
		t.Release()
		return nil, fmt.Errorf("affinity: creating session: %w", err)
	}
	return e.newDecision(st, idx, t, id, true, now), nil
}

// rebind moves an Active session whose instance can no longer serve it (unhealthy or removed)
// to a newly placed other instance, moving its session slot (the old one is freed only once the
// move is stored, and never counted in the placement), and admits the request there. errRetry
// means the session changed meanwhile.
func (e *Engine) rebind(ctx context.Context, st *svcState, s session.Session, now time.Time) (*decision, error) {
	sticky := s.Kind == session.KindSticky
	if e.slotStore != nil && !sticky {
		return e.rebindShared(ctx, st, s, now)
	}
	idx, t, rej := e.placeRebind(ctx, st, s, sticky)
	if rej != nil {
		return nil, rej
	}
	old, to := s.Instance, st.ids[idx]
	if err := e.moveSession(ctx, st, s.ID, old, to); err != nil {
		t.Release()
		if !sticky {
			st.slots[idx].ReleaseSession()
		}
		return nil, err
	}
	if !sticky {
		if sl := e.slotsOf(registry.Key{Service: st.svc.Name, ID: old}); sl != nil {
			sl.ReleaseSession()
		}
	}
	e.store.Touch(ctx, st.svc.Name, s.ID, now)
	e.log.Info("affinity: rebound a session whose instance cannot serve it", "service", st.svc.Name,
		"session", s.ID, "from", old, "to", to)
	d := e.newDecision(st, idx, t, s.ID, false, now)
	if sticky {
		d.h = cookieIssue{} // the sticky session moved: re-issue its cookie
	}
	return d, nil
}

// placeRebind picks the instance a rebound session moves to: a sticky session takes any free
// instance round-robin (it holds no session slot); any other a new session slot on an instance
// other than its own.
func (e *Engine) placeRebind(ctx context.Context, st *svcState, s session.Session, sticky bool) (int, *balance.Ticket, *Reject) {
	if sticky {
		return e.pickFree(ctx, st, protoHTTP, registry.BalanceRoundRobin, "")
	}
	own, ok := st.byID[s.Instance]
	if !ok {
		own = -1
	}
	return e.placeSessionExcept(ctx, st, true, own)
}

// moveSession stores session id's move from instance old to instance to. errRetry means the
// session changed meanwhile (moved, lapsed, ended or gone).
func (e *Engine) moveSession(ctx context.Context, st *svcState, id, old, to string) error {
	_, err := e.store.Update(ctx, st.svc.Name, id, func(cur *session.Session) error {
		if cur.Instance != old {
			return errRetry
		}
		cur.Instance = to
		return nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errRetry) || errors.Is(err, session.ErrExpired) || errors.Is(err, session.ErrEnded) || errors.Is(err, session.ErrNotFound):
		return errRetry
	default:
		return fmt.Errorf("affinity: rebinding session: %w", err)
	}
}

// routeExisting routes a request of an Active session: its instance when routable (429 when
// its request slots are full), else a rebind. ok false means the record is not Active.
func (e *Engine) routeExisting(ctx context.Context, st *svcState, s session.Session, now time.Time) (*decision, error) {
	if idx, ok := st.byID[s.Instance]; ok && st.routable[idx] {
		t, rej := e.admit(ctx, st, idx)
		if rej != nil {
			return nil, rej
		}
		e.store.Touch(ctx, st.svc.Name, s.ID, now)
		e.promote(ctx, st, s) // the client came back with the id
		return e.newDecision(st, idx, t, s.ID, false, now), nil
	}
	d, err := e.rebind(ctx, st, s, now)
	if err == nil {
		e.promote(ctx, st, s)
	}
	return d, err
}
