package session

import (
	"context"
	"errors"
)

// ErrStoreUnavailable reports that the shared store could not be reached; the operation may or
// may not have been applied (check with Get). It wraps the client's error.
var ErrStoreUnavailable = errors.New("session store unavailable")

// ErrNoRoom: no candidate instance has a free session slot (placement refused).
var ErrNoRoom = errors.New("no instance has a free session slot")

// ErrChanged: the session changed concurrently (another instance, ended, lapsed) before a
// placement could move it; the caller reads it again.
var ErrChanged = errors.New("session changed concurrently")

// PlaceCandidate is one instance a placement may choose.
type PlaceCandidate struct {
	Instance string
	// Standby instances take a session only when no active candidate has room (scale-out).
	Standby bool
	// Cap is the instance's session cap (sessionsPerInstance).
	Cap int
}

// SlotStore is a Store that keeps every instance's session-slot count itself, so that the
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

// Reservation is a provisional session slot held in the store for a session whose id is not
// known yet (an MCP initialize or SSE GET until its response names the session, a handle
// mint until the handle is learned). It counts against the instance's sessionsPerInstance on
// every replica from Reserve until CreateReserved converts it or Release frees it. Pass it by
// value; its zero value holds nothing.
type Reservation struct {
	Service, Instance string
	// ScaleOut reports that the reservation opened a standby instance (no active candidate
	// had room).
	ScaleOut bool
	// Token identifies the reservation in the store that issued it (opaque; "": none).
	Token string
}

// Held reports whether r came from a successful Reserve.
func (r Reservation) Held() bool { return r.Token != "" }
