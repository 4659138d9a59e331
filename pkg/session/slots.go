package session

import "errors"

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
