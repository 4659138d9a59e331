package session

import (
	"context"
	"time"
)

// Store is the session table as the engine sees it. It is deliberately small so that a shared
// backend (Redis/Valkey) can implement it next to the in-memory MemStore.
//
// All methods are safe for concurrent use. Sessions go in and come out as values: a Store never
// keeps a reference to a caller's Attributes map and never hands out one into its own table.
// A session is identified by (service, id); ids are unique per service, not globally.
type Store interface {
	// Create inserts s as an Active session. Status and Ended are ignored (the session is
	// stored Active), a zero Created means now and a zero LastSeen means Created; LastModified
	// is set to now. It returns ErrExists if a session (s.Service, s.ID) is Active; an ended
	// record with the same key (or an Active one that has already lapsed) is replaced.
	// ErrInvalid reports a malformed session.
	Create(ctx context.Context, s Session) error
	// Get returns the record (service, id) in any status while it is retained, ErrNotFound
	// otherwise. LastSeen includes Touch updates. An Active record whose ExpiresAt has passed is
	// returned with Status Expired and Ended set to its ExpiresAt.
	Get(ctx context.Context, service, id string) (Session, error)
	// Touch records a request on an Active session at now, which restarts its idle timer.
	// It is the per-request hot path: it takes no write transaction and does not allocate.
	// Touching an unknown, ended or already lapsed session does nothing (a touch never revives
	// a session), and a now older than the last touch does nothing.
	Touch(service, id string, now time.Time)
	// Update applies fn to a copy of an Active session and stores the result with LastModified
	// set to now. fn may change Instance, Kind, TTL, IdleTimeout, LastSeen, DisableReuse and
	// Attributes; changing ID, Service, Status, Created or Ended fails with ErrInvalid. If fn
	// returns an error nothing changes and the error is returned wrapped. Errors: ErrNotFound,
	// ErrEnded (ended record), ErrExpired (Active but lapsed). fn must not call the Store.
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
}

// Filter selects sessions in List. Empty fields match anything; Status compares against the
// status Get would report (a lapsed Active session matches StatusExpired).
type Filter struct {
	Service  string
	Instance string
	ID       string
	Status   Status
}

// List page sizes: a limit <= 0 means DefaultListLimit and larger limits are cut to
// MaxListLimit.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)
