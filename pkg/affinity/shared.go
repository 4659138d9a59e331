package affinity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// SlotSource makes the counters of an instance with the given caps.
type SlotSource func(k registry.Key, sessionCap, requestCap int) *balance.Slots

// WithSharedSlots makes the engine count slots together with the other replicas sharing its
// store (the quota seam; without it every counter is this process's balance.NewSlots):
//   - session slots are counted by the store (the store must be a session.SlotStore): a new
//     session or a rebind is placed by the store in one atomic step against every replica's
//     sessions, so sessionsPerInstance holds across replicas; ends free slots in the store,
//     not here. The provisional slot of an MCP initialize, an SSE GET or a handle mint
//     (a session whose id its response names) is a reservation in the store
//     (SlotStore.Reserve), counted with the sessions on every replica, that the binding
//     converts in the same step, or that the exchange's end releases; a dead replica's
//     reservations expire after the store's reservation TTL. So the cap holds across
//     replicas during concurrent initializes too;
//   - request slots come from src's counters (balance.NewSharedSlots over pkg/quota leases),
//     so requestSlotsPerInstance holds across replicas without a round trip per request.
func WithSharedSlots(src SlotSource) Option { return func(e *Engine) { e.slotSource = src } }

// newSlots returns fresh counters for an instance.
func (e *Engine) newSlots(k registry.Key, svc registry.Service) *balance.Slots {
	if e.slotSource != nil {
		return e.slotSource(k, svc.SessionsPerInstance, svc.RequestSlotsPerInstance)
	}
	return balance.NewSlots(svc.SessionsPerInstance, svc.RequestSlotsPerInstance)
}

// placeCandidates lists the instances a shared placement may choose, in index order: healthy
// active or standby instances with a free request slot (as this replica sees them).
func (st *svcState) placeCandidates() []session.PlaceCandidate {
	c := make([]session.PlaceCandidate, 0, len(st.insts))
	for i := range st.insts {
		if !st.placeable[i] && !st.standby[i] || !st.hasRequestSlot(i) {
			continue
		}
		capS, _ := st.slots[i].Caps()
		c = append(c, session.PlaceCandidate{Instance: st.ids[i], Standby: !st.placeable[i], Cap: capS})
	}
	return c
}

// storeDown is what a new session (or a rebind) gets while the shared store cannot be reached:
// 503 with Retry-After, so clients retry; sessions this replica knows keep routing.
func (e *Engine) storeDown(st *svcState, err error) *Reject {
	e.log.Warn("affinity: session store unreachable; refusing a new session", "service", st.svc.Name, "err", err)
	return e.reject(ClassNoCapacity, "StoreUnavailable",
		fmt.Sprintf("service %q cannot place new sessions now: the session store is unreachable", st.svc.Name))
}

// storeUnreadable is what a request of a session this replica has not cached gets while the
// shared store cannot be reached: 503 StoreUnavailable with Retry-After, as a new session gets
// (the session is not lost: it routes again once the store answers), never a 500.
func (e *Engine) storeUnreadable(st *svcState, err error) *Reject {
	e.log.Warn("affinity: session store unreachable; refusing a session this replica has not cached", "service", st.svc.Name, "err", err)
	return e.reject(ClassNoCapacity, "StoreUnavailable",
		fmt.Sprintf("service %q cannot read the session now: the session store is unreachable", st.svc.Name))
}

func (e *Engine) noRoom(st *svcState) *Reject {
	return e.reject(ClassNoCapacity, "NoCapacity",
		fmt.Sprintf("no instance of service %q can take a new session: every healthy instance is full", st.svc.Name))
}

// placeShared creates s through the store's atomic placement and returns the instance index.
func (e *Engine) placeShared(ctx context.Context, st *svcState, s session.Session) (int, error) {
	inst, scaleOut, err := e.slotStore.PlaceCreate(ctx, s, st.placeCandidates())
	if errors.Is(err, session.ErrNoRoom) {
		return -1, e.noRoom(st)
	}
	if errors.Is(err, session.ErrStoreUnavailable) {
		return -1, e.storeDown(st, err)
	}
	if err != nil {
		return -1, err
	}
	idx, ok := st.byID[inst]
	if !ok {
		return -1, fmt.Errorf("affinity: the store placed session %q on unknown instance %q", s.ID, inst)
	}
	if scaleOut && e.slotStore.SessionCount(ctx, st.svc.Name, inst) <= 1 {
		e.signalScaleOut(st, idx)
	}
	return idx, nil
}

// createShared is createSession with shared slots: placement and binding in one store step,
// then a request slot on the chosen instance (if none is free, the new session is ended again
// and the request refused with 429).
func (e *Engine) createShared(ctx context.Context, st *svcState, id string, kind session.Kind, now time.Time) (*decision, error) {
	if len(st.insts) == 0 {
		return nil, e.noRoom(st)
	}
	if id == "" {
		var err error
		if id, err = session.NewID(); err != nil {
			return nil, fmt.Errorf("affinity: generating a session id: %w", err)
		}
	}
	rec := e.newRecord(st, id, 0, kind, now)
	e.markProvisional(st, &rec)
	idx, err := e.placeShared(ctx, st, rec)
	if err != nil {
		var rej *Reject
		if errors.As(err, &rej) {
			return nil, rej
		}
		return nil, fmt.Errorf("affinity: creating session: %w", err)
	}
	t, rej := e.admit(ctx, st, idx)
	if rej != nil {
		if _, err := e.store.End(ctx, st.svc.Name, id, session.StatusTerminated, e.now()); err != nil {
			e.log.Warn("affinity: ending a session placed on an instance without a free request slot", "service", st.svc.Name, "session", id, "err", err)
		}
		return nil, rej
	}
	return e.newDecision(st, idx, t, id, true, now), nil
}

// rebindShared is rebind with shared slots: the store moves the binding and its slot in one
// step.
func (e *Engine) rebindShared(ctx context.Context, st *svcState, s session.Session, now time.Time) (*decision, error) {
	// The session's own instance is never a candidate: it cannot serve the session, and the
	// session must not be counted against the slot it holds there.
	cands := slices.DeleteFunc(st.placeCandidates(), func(c session.PlaceCandidate) bool { return c.Instance == s.Instance })
	inst, err := e.slotStore.PlaceMove(ctx, st.svc.Name, s.ID, s.Instance, cands)
	switch {
	case errors.Is(err, session.ErrNoRoom):
		return nil, e.noRoom(st)
	case errors.Is(err, session.ErrChanged):
		return nil, errRetry
	case errors.Is(err, session.ErrStoreUnavailable):
		return nil, e.storeDown(st, err)
	case err != nil:
		return nil, fmt.Errorf("affinity: rebinding session: %w", err)
	}
	idx, ok := st.byID[inst]
	if !ok {
		return nil, errRetry
	}
	t, rej := e.admit(ctx, st, idx)
	if rej != nil {
		return nil, rej
	}
	e.store.Touch(ctx, st.svc.Name, s.ID, now)
	e.log.Info("affinity: rebound a session whose instance cannot serve it", "service", st.svc.Name,
		"session", s.ID, "from", s.Instance, "to", inst)
	return e.newDecision(st, idx, t, s.ID, false, now), nil
}

// openProvisional opens a session whose id is not known yet (an MCP initialize, an SSE GET, a
// handle's mint): it admits the new session under peer's client limits, places it
// provisionally (see placeProvisional) and returns the decision holding the client claim, the
// provisional slot and, when withRequest, a request slot. The caller sets the decision's
// handler.
func (e *Engine) openProvisional(ctx context.Context, st *svcState, peer string, withRequest bool, now time.Time) (*decision, *Reject) {
	claim, rej := e.admitNewSession(ctx, st, peer, now)
	if rej != nil {
		return nil, rej
	}
	idx, t, rsv, rej := e.placeProvisional(ctx, st, withRequest)
	if rej != nil {
		claim.release()
		return nil, rej
	}
	d := e.newDecision(st, idx, t, "", true, now)
	d.claim, d.provisional, d.provIdx, d.rsv = claim, true, idx, rsv
	return d, nil
}

// placeProvisional places a session whose id is not known yet: a provisional session slot
// (a store reservation with shared slots, else a slot of this process's counters) and, when
// withRequest, a request slot. The returned reservation is held only with shared slots.
func (e *Engine) placeProvisional(ctx context.Context, st *svcState, withRequest bool) (int, *balance.Ticket, session.Reservation, *Reject) {
	if e.slotStore == nil {
		idx, t, rej := e.placeSession(ctx, st, withRequest)
		return idx, t, session.Reservation{}, rej
	}
	if len(st.insts) == 0 {
		return -1, nil, session.Reservation{}, e.noRoom(st)
	}
	rsv, err := e.slotStore.Reserve(ctx, st.svc.Name, st.placeCandidates())
	switch {
	case errors.Is(err, session.ErrNoRoom):
		return -1, nil, rsv, e.noRoom(st)
	case errors.Is(err, session.ErrStoreUnavailable):
		return -1, nil, rsv, e.storeDown(st, err)
	case err != nil:
		e.log.Error("affinity: reserving a session slot", "service", st.svc.Name, "err", err)
		return -1, nil, rsv, e.storeDown(st, err)
	}
	idx, ok := st.byID[rsv.Instance]
	if !ok {
		e.releaseReservation(st, rsv)
		return -1, nil, session.Reservation{}, e.noRoom(st)
	}
	if rsv.ScaleOut && e.slotStore.SessionCount(ctx, st.svc.Name, rsv.Instance) <= 1 {
		e.signalScaleOut(st, idx)
	}
	var t *balance.Ticket
	if withRequest {
		var rej *Reject
		if t, rej = e.admit(ctx, st, idx); rej != nil {
			e.releaseReservation(st, rsv)
			return -1, nil, session.Reservation{}, rej
		}
	}
	return idx, t, rsv, nil
}

// releaseReservation frees a reservation (a failure is logged: it expires after the store's
// reservation TTL).
func (e *Engine) releaseReservation(st *svcState, rsv session.Reservation) {
	if err := e.slotStore.Release(context.Background(), rsv); err != nil {
		e.log.Warn("affinity: releasing a session-slot reservation; it expires by itself", "service", st.svc.Name, "instance", rsv.Instance, "err", err)
	}
}

// bindProvisionalLocked creates the session rec that takes over the decision's provisional
// slot (converting its reservation in the same store step). On error the slot is still
// provisional. d.mu must be held.
func (d *decision) bindProvisionalLocked(ctx context.Context, rec session.Session) error {
	if d.rsv.Held() {
		if err := d.e.slotStore.CreateReserved(ctx, rec, d.rsv); err != nil {
			return err
		}
		d.rsv, d.provisional = session.Reservation{}, false
		d.claim.bind(rec.ID)
		d.claim = nil
		return nil
	}
	if err := d.e.store.Create(ctx, rec); err != nil {
		return err
	}
	d.provisional = false
	d.claim.bind(rec.ID)
	d.claim = nil
	d.e.boundShared(d.st.slots[d.provIdx])
	return nil
}

// boundShared hands a provisional slot over to a session the store now counts.
func (e *Engine) boundShared(sl *balance.Slots) {
	if e.slotStore != nil {
		sl.ReleaseSession()
	}
}
