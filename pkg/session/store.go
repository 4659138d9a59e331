package session

import (
	"context"
	"time"
)

// Store is the session table as the engine sees it. It is deliberately small so that a shared
// backend (pkg/session/redisstore, on Redis or Valkey) implements it next to the in-memory one
// (pkg/session/memstore); sessiontest.RunConformance checks every rule below against both.
//
// All methods are safe for concurrent use. Sessions go in and come out as values: a Store never
// keeps a reference to a caller's Attributes map and never hands out one into its own table.
// A session is identified by (service, id); ids are unique per service, not globally.
//
// Several handles (one per tether replica) may share one store. Every rule below holds across
// handles: what one handle commits, every other handle reads (Get, List, ActiveByInstance)
// once the change has been committed, except touches, which may reach other handles up to
// TouchDelay later (see Touch).
//
// # End notification
//
// Every session that leaves Active (End, the store's own expiry, a Create replacing a lapsed
// session) leaves it in exactly one atomic transition of the shared table: two handles can
// never both end the same session, and End on the loser reports ErrEnded. The handler set with
// SetEndHandler is then called:
//   - exactly once with Local true, on the handle that made the transition (the one whose End,
//     reaper or Create did it), after it has been committed; this call is the one slot
//     accounting that lives in one process may count on ("once" is per transition, not per
//     replica);
//   - at most once with Local false on every other handle that shares the store. These calls
//     are best effort (a handle that was disconnected misses them) and serve only to stop
//     local work bound to the session (open exchanges, caches), never to count.
//
// A store that keeps the session slot counts itself (SlotStore) changes them inside that same
// transition, so shared counts need no notification at all.
//
// # Capabilities
//
// A backend may offer more than Store; each capability is a small named interface below, with
// its own contract, checked by the stores with a compile-time assertion and found by its
// users with one type assertion: TouchFlusher (batched touches), InstanceCounter
// (per-instance counts without a listing) and SlotStore (slot counts, placements and
// reservations kept by the store itself, which the engine requires for shared slots).
type Store interface {
	// Create inserts s as an Active session. Status and Ended are ignored (the session is
	// stored Active), a zero Created means now and a zero LastSeen means Created; LastModified
	// is set to now. It returns ErrExists if a session (s.Service, s.ID) is Active. An ended
	// record with the same key (or an Active one that has already lapsed) is replaced, unless
	// that record has DisableReuse set: then Create returns ErrReuseDisabled and changes
	// nothing. The check and the insert are one atomic step: no concurrent Create, End or
	// Update on any handle can slip between them. ErrInvalid reports a malformed session.
	Create(ctx context.Context, s Session) error
	// Get returns the record (service, id) in any status while it is retained, ErrNotFound
	// otherwise. LastSeen includes this handle's touches and those of other handles that are
	// older than TouchDelay. An Active record whose ExpiresAt has passed is returned with
	// Status Expired and Ended set to its ExpiresAt.
	Get(ctx context.Context, service, id string) (Session, error)
	// Touch records a request on an Active session at now, which restarts its idle timer.
	// It is the per-request hot path: it takes no write transaction, does not allocate in the
	// steady state and never waits for the network. Touching an unknown, ended or already
	// lapsed session does nothing (a touch never revives a session), and a now older than the
	// last touch does nothing.
	//
	// A store may batch touches: it keeps the latest time per session and writes it within
	// TouchDelay (0: at once). Idle expiry is judged on the LastSeen the store holds, so the
	// idle timeout is kept to within TouchDelay: a session whose requests are never more than
	// IdleTimeout − TouchDelay apart never idles out, whichever handles serve them; one left
	// alone for IdleTimeout ends no later than IdleTimeout after its last request plus the
	// reaper's interval. ctx bounds nothing on the request path (Touch never blocks); it
	// carries request-scoped values only.
	Touch(ctx context.Context, service, id string, now time.Time)
	// TouchDelay is the longest a Touch may wait before every handle sees it (0: at once).
	TouchDelay() time.Duration
	// Update applies fn to a copy of an Active session and stores the result with LastModified
	// set to now. fn may change Instance, Kind, TTL, IdleTimeout, LastSeen, DisableReuse and
	// Attributes; changing ID, Service, Status, Created or Ended fails with ErrInvalid. If fn
	// returns an error nothing changes and the error is returned wrapped. Errors: ErrNotFound,
	// ErrEnded (ended record), ErrExpired (Active but lapsed). fn must not call the Store; a
	// shared store may call it more than once (optimistic concurrency), so it must not have
	// side effects.
	Update(ctx context.Context, service, id string, fn func(*Session) error) (Session, error)
	// End moves an Active session to status (StatusExpired or StatusTerminated, else
	// ErrInvalid) with Ended = now and returns the ended record. ErrNotFound if there is no
	// record, ErrEnded if it has already ended. A session that had already lapsed at now is
	// ended as Expired at its ExpiresAt; unless status was StatusExpired, End then also returns
	// an error matching both ErrEnded and ErrExpired.
	End(ctx context.Context, service, id string, status Status, now time.Time) (Session, error)
	// List returns up to limit sessions matching f, ordered by (service, id), and the token of
	// the next page ("" when there is none). pageToken "" starts at the beginning; tokens are
	// opaque positions, so a walk over all pages returns every session that exists throughout
	// the walk exactly once, whatever is added or removed meanwhile. Statuses are reported as
	// Get reports them. ErrInvalidPageToken reports a token this store did not produce.
	List(ctx context.Context, f Filter, pageToken string, limit int) ([]Session, string, error)
	// ActiveByInstance returns, ordered by id, the sessions bound to (service, instance) that
	// have not left Active yet, i.e. every session that still holds one of the instance's
	// session slots. Statuses are reported as stored (Active): a session that lapsed moments ago
	// but has not been ended yet is included; its end will be announced like any other.
	ActiveByInstance(ctx context.Context, service, instance string) ([]Session, error)
	// SetEndHandler sets the function called for every session that leaves Active (see End
	// notification above); nil stops the calls. It may be called at any time; a change applies
	// to ends announced after it returns. fn runs outside every store lock and may call the
	// store, but it should return quickly: it delays later notifications of this handle.
	SetEndHandler(fn func(EndEvent))
}

// EndEvent announces that a session left Active.
type EndEvent struct {
	// Session is the ended record (Status Expired or Terminated, Ended set). It is the
	// handler's own copy.
	Session Session
	// Local reports that this handle made the transition; exactly one handle sees Local true
	// for each transition (see Store).
	Local bool
}

// TouchFlusher is implemented by stores that batch touches (TouchDelay > 0; redisstore):
// FlushTouches writes every touch taken so far and returns when they are visible to every
// handle. The conformance suite flushes through it; the store's Run flushes on its own.
type TouchFlusher interface {
	FlushTouches(ctx context.Context) error
}

// InstanceCounter is implemented by stores that keep per-instance counts of their sessions
// (memstore): CountActiveByInstance reports, by kind, how many sessions ActiveByInstance
// would return at the moment of the call, without listing them. The engine counts restored
// sessions into their instances' slots with it (else with ActiveByInstance).
type InstanceCounter interface {
	CountActiveByInstance(ctx context.Context, service, instance string) (map[Kind]int, error)
}

// SlotStore is implemented by a Store (redisstore) that keeps every instance's session-slot count itself, so that the
// count is exact across every replica sharing the store: the count changes in the same atomic
// step as the binding (create, rebind, end, expiry), and placements choose the instance and
// write the binding in one step, against the counts of that moment.
//
// Placement rule (balance.Place): among the active candidates with room (count < Cap), the
// fullest, ties to the first; only when none has room, the same among standby candidates
// (scaleOut true); else ErrNoRoom.
type SlotStore interface {
	Store
	// PlaceCreate creates s (s.Instance ignored) on the instance the rule picks, with the
	// errors of Create, and returns the instance.
	PlaceCreate(ctx context.Context, s Session, c []PlaceCandidate) (instance string, scaleOut bool, err error)
	// PlaceMove rebinds the Active session (service, id) from instance from to the instance
	// the rule picks, moving its slot. ErrChanged if it is no longer Active on from.
	PlaceMove(ctx context.Context, service, id, from string, c []PlaceCandidate) (instance string, err error)
	// SessionCount returns the instance's slot-holding stored-Active sessions and live
	// reservations, as the store counts them (served from the client-side cache; 0 when
	// unknown).
	SessionCount(ctx context.Context, service, instance string) int
	// Reserve holds a provisional session slot (a session whose id is not known yet) on the
	// instance the rule picks, counted with the sessions; ErrNoRoom without room. A
	// reservation its holder stops renewing (a dead replica) expires after a TTL.
	Reserve(ctx context.Context, service string, c []PlaceCandidate) (Reservation, error)
	// CreateReserved creates s (with the errors of Create) taking over rsv's slot in the same
	// atomic step; on error rsv is still held.
	CreateReserved(ctx context.Context, s Session, rsv Reservation) error
	// Release frees a reservation not converted (idempotent).
	Release(ctx context.Context, rsv Reservation) error
}

// Filter selects sessions in List. Empty fields match anything; Status compares against the
// status Get would report (a lapsed Active session matches StatusExpired).
type Filter struct {
	Service  string
	Instance string
	ID       string
	Status   Status
}

// Match applies the whole filter to a session as Get reports it.
func (f Filter) Match(s Session) bool {
	return (f.Service == "" || s.Service == f.Service) &&
		(f.Instance == "" || s.Instance == f.Instance) &&
		(f.ID == "" || s.ID == f.ID) &&
		(f.Status == "" || s.Status == f.Status)
}

// List page sizes: a limit <= 0 means DefaultListLimit and larger limits are cut to
// MaxListLimit.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)
