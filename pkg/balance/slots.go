package balance

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Slots accounts one instance's session slots and request slots. It is safe for concurrent use
// and lock-free: every operation is an atomic load, add or compare-and-swap loop.
//
// Guarantees:
//   - TryAcquireSession and TryAcquireRequest never admit beyond the cap in force when they run:
//     with a request cap of 200 there are never 201 admitted requests in flight, under any
//     concurrency.
//   - Counters never go negative: ReleaseSession at zero is a no-op, and a request slot is only
//     given back through its Ticket, whose Release works exactly once.
//   - SetCaps changes the caps for future acquisitions only; nothing already admitted is revoked,
//     so after lowering a cap the counters may stay above it until enough slots are released.
//
// The zero value is not usable; create Slots with NewSlots (this process's atomics) or
// NewSharedSlots (counts shared with other tether replicas, see RequestPool).
type Slots struct {
	sessions   atomic.Int64
	requests   atomic.Int64
	sessionCap atomic.Int64
	requestCap atomic.Int64

	// pool, when set, is where request slots come from (shared across replicas); shared,
	// when set, returns the session count kept elsewhere (the session store), to which the
	// local count adds this process's provisional holds.
	pool   RequestPool
	shared func() int
}

// RequestPool is the seam behind which an instance's request slots are shared with other
// processes: pkg/quota implements it with per-replica leases on Redis, so that the cap holds
// across every replica without a round trip per request. TryAcquire takes one slot if the
// pool has one (never beyond the cap across all processes sharing it), waiting for other
// processes (a round trip) no later than ctx's deadline; Release gives back
// one taken by TryAcquire; InFlight is this process's slots in use. Implementations are safe
// for concurrent use.
type RequestPool interface {
	TryAcquire(ctx context.Context) bool
	Release()
	InFlight() int
}

// NewSharedSlots returns Slots whose request slots come from pool and whose session count is
// shared() plus the sessions counted here (provisional holds, AddSessions). The guarantees
// above hold for the request cap across every process sharing pool; the session cap is kept
// by the store's atomic placement (session.SlotStore), TryAcquireSession only guards the
// provisional holds against the count seen here.
func NewSharedSlots(sessionCap, requestCap int, pool RequestPool, shared func() int) *Slots {
	s := NewSlots(sessionCap, requestCap)
	s.pool, s.shared = pool, shared
	return s
}

// NewSlots returns Slots with the given caps and no session or request in use. A cap ≤ 0 admits
// nothing.
func NewSlots(sessionCap, requestCap int) *Slots {
	s := &Slots{}
	s.SetCaps(sessionCap, requestCap)
	return s
}

// SetCaps sets the session and request caps for future acquisitions. It never revokes slots
// already held. Each cap is read independently by acquirers, so a concurrent acquisition sees
// either the old or the new value of each cap.
func (s *Slots) SetCaps(sessionCap, requestCap int) {
	s.sessionCap.Store(int64(sessionCap))
	s.requestCap.Store(int64(requestCap))
}

// Caps returns the current session and request caps.
func (s *Slots) Caps() (sessionCap, requestCap int) {
	return int(s.sessionCap.Load()), int(s.requestCap.Load())
}

// TryAcquireSession takes one session slot if fewer than the session cap are in use and reports
// whether it did. The caller gives the slot back with ReleaseSession when the session ends.
func (s *Slots) TryAcquireSession() bool {
	if s.shared != nil {
		for {
			cur := s.sessions.Load()
			if cur+int64(s.shared()) >= s.sessionCap.Load() {
				return false
			}
			if s.sessions.CompareAndSwap(cur, cur+1) {
				return true
			}
		}
	}
	return tryIncrement(&s.sessions, &s.sessionCap)
}

// ReleaseSession gives back one session slot. At zero it does nothing, so the count never goes
// negative; callers must still pair it with a successful TryAcquireSession or AddSessions.
func (s *Slots) ReleaseSession() {
	for {
		cur := s.sessions.Load()
		if cur <= 0 {
			return
		}
		if s.sessions.CompareAndSwap(cur, cur-1) {
			return
		}
	}
}

// AddSessions counts n sessions as in use without checking the cap. It is meant for restoring
// sessions from a snapshot, where every restored session must keep its instance even if the cap
// shrank meanwhile; the count may then exceed the cap and TryAcquireSession fails until enough
// sessions end. n ≤ 0 does nothing.
func (s *Slots) AddSessions(n int) {
	if n > 0 {
		s.sessions.Add(int64(n))
	}
}

// Sessions returns the number of session slots in use (possibly above the cap after AddSessions
// or a lowered cap).
func (s *Slots) Sessions() int {
	n := int(s.sessions.Load())
	if s.shared != nil {
		n += s.shared()
	}
	return n
}

// TryAcquireRequest takes one request slot if fewer than the request cap are in flight. On
// success it returns a Ticket that gives the slot back on its first Release; on failure it
// returns nil, false. It allocates one small Ticket per admitted request. ctx bounds the wait
// for a shared pool (a local one never waits).
func (s *Slots) TryAcquireRequest(ctx context.Context) (*Ticket, bool) {
	if s.pool != nil {
		if !s.pool.TryAcquire(ctx) {
			return nil, false
		}
		return &Ticket{slots: s}, true
	}
	if !tryIncrement(&s.requests, &s.requestCap) {
		return nil, false
	}
	return &Ticket{slots: s}, true
}

// Requests returns the number of request slots in flight (in this process, for shared slots).
func (s *Slots) Requests() int {
	if s.pool != nil {
		return s.pool.InFlight()
	}
	return int(s.requests.Load())
}

// tryIncrement adds one to *n if the result stays ≤ *limit, with a CAS loop so that concurrent
// callers can never together overshoot the limit.
func tryIncrement(n, limit *atomic.Int64) bool {
	for {
		cur := n.Load()
		if cur >= limit.Load() {
			return false
		}
		if n.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// Ticket is one admitted request's hold on a request slot. It is safe for concurrent use:
// Release may be called from several goroutines and gives the slot back exactly once, and a
// Release that races with Detach gives it back only if Detach fails.
type Ticket struct {
	slots *Slots
	state atomic.Int32 // ticketHeld, ticketDone, ticketDetaching, ticketDetachingReleased
}

// A Ticket's states.
const (
	ticketHeld int32 = iota
	ticketDone
	ticketDetaching         // Detach is running
	ticketDetachingReleased // Detach is running and Release was called meanwhile
)

// Release gives the request slot back. It returns true only for the first call on a Ticket;
// later calls (and calls on a nil Ticket, or after a Detach) return false and change nothing,
// so a slot is never released twice and the in-flight count never goes negative. During a
// Detach it returns true and the slot is given back only if the Detach fails.
func (t *Ticket) Release() bool {
	if t == nil || t.slots == nil {
		return false
	}
	for {
		switch t.state.Load() {
		case ticketHeld:
			if t.state.CompareAndSwap(ticketHeld, ticketDone) {
				t.give()
				return true
			}
		case ticketDetaching:
			if t.state.CompareAndSwap(ticketDetaching, ticketDetachingReleased) {
				return true
			}
		default:
			return false
		}
	}
}

func (t *Ticket) give() {
	if t.slots.pool != nil {
		t.slots.pool.Release()
		return
	}
	t.slots.requests.Add(-1)
}

// Detacher is a RequestPool whose slots can outlive this process: pkg/quota's detached holds,
// counted against the cap by every process sharing the pool until they expire.
type Detacher interface {
	// Detach takes one slot in use out of this process's count and keeps it taken for d
	// (at least), or fails and changes nothing here.
	Detach(ctx context.Context, d time.Duration) error
}

// ErrDetached is Detach's error for a Ticket already released or detached.
var ErrDetached = errors.New("balance: the ticket's slot was already given back")

// Detach hands the slot over to an exchange that goes on without this process (an ext_proc
// stream handed off to the data plane at shutdown) and ends within d. With a shared pool
// (a Detacher) the slot stays counted against the cap across every process for d, after
// this process is gone; it fails (the ticket keeps its slot) when the pool cannot promise
// that, e.g. d ≤ 0 (no bound) or its lease lapsed. With this process's own counters the
// slot is released: those counts end with the process (another process counting the same
// instance does not learn of it). Either way a later Release does nothing.
func (t *Ticket) Detach(ctx context.Context, d time.Duration) error {
	if t == nil || t.slots == nil {
		return ErrDetached
	}
	if t.slots.pool == nil {
		if !t.Release() {
			return ErrDetached
		}
		return nil
	}
	dt, ok := t.slots.pool.(Detacher)
	if !ok {
		return errors.New("balance: the shared request pool cannot detach a slot")
	}
	if !t.state.CompareAndSwap(ticketHeld, ticketDetaching) {
		return ErrDetached
	}
	err := dt.Detach(ctx, d)
	if err == nil {
		t.state.Store(ticketDone) // a Release meanwhile has nothing to give back
		return nil
	}
	if !t.state.CompareAndSwap(ticketDetaching, ticketHeld) {
		t.state.Store(ticketDone) // Release was called meanwhile: give the slot back now
		t.give()
	}
	return err
}

// Fenced reports whether the slot comes from a shared pool whose lease lapsed while exchanges
// were still in flight on it (pkg/quota's fence): the exchange must end, because the other
// replicas may soon be lent its slot. Always false for this process's own counters.
func (t *Ticket) Fenced() bool {
	if t == nil || t.slots == nil || t.state.Load() != ticketHeld {
		return false
	}
	f, ok := t.slots.pool.(interface{ Fenced() bool })
	return ok && f.Fenced()
}

// Released reports whether Release (or a Detach) has already given the slot up.
func (t *Ticket) Released() bool {
	if t == nil {
		return true
	}
	s := t.state.Load()
	return s == ticketDone || s == ticketDetachingReleased
}
