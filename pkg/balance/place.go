package balance

// Candidate describes one instance to Place. The caller includes only instances that may take a
// new session at all (healthy, not draining); an instance with neither Active nor Standby set is
// ignored.
type Candidate struct {
	// Active marks an instance of the active pool: it takes new sessions while it has room.
	Active bool
	// Standby marks an overflow instance: it takes new sessions only when every Active
	// candidate is full (scale-out). Active wins if both are set.
	Standby bool
	// Sessions is the number of session slots in use; SessionCap is the cap (sessionsPerInstance).
	Sessions, SessionCap int
}

func (c Candidate) hasRoom() bool { return c.Sessions < c.SessionCap }

// Place chooses the instance for a new session with the seed rule ("reuse existing instances,
// scale out only when all are full"):
//
//  1. Among Active candidates with a free session slot (Sessions < SessionCap), pick the
//     fullest — the one with the most sessions — so lightly used instances drain and can be
//     scaled in. Ties go to the lowest index. scaleOut is false.
//  2. If no Active candidate has room (every Active one is full, or there is none), pick among
//     Standby candidates with room by the same rule (fullest, then lowest index), so a standby
//     that already took overflow is filled before another one is opened. scaleOut is true.
//  3. If no candidate has room, ok is false (the "no capacity" outcome, 503-class).
//
// An empty Active instance is thus used only when every Active instance holding sessions is full
// (seed scenario 1: with 2 sessions per instance, Client3 lands on Instance2); Place does not
// report that as a scale-out because the instance is already in the active pool — callers that
// want the seed's "a new instance was opened" signal can check c[idx].Sessions == 0.
//
// Place is a pure function: it reads c only and keeps no state. The counts are a snapshot; the
// caller then takes the slot with Slots.TryAcquireSession and calls Place again if it lost a race.
func Place(c []Candidate) (idx int, scaleOut bool, ok bool) {
	if i := fullestWithRoom(c, func(x Candidate) bool { return x.Active }); i >= 0 {
		return i, false, true
	}
	if i := fullestWithRoom(c, func(x Candidate) bool { return !x.Active && x.Standby }); i >= 0 {
		return i, true, true
	}
	return -1, false, false
}

// fullestWithRoom returns the index of the candidate in the pool with room and the most sessions
// (lowest index on ties), or -1.
func fullestWithRoom(c []Candidate, inPool func(Candidate) bool) int {
	best := -1
	for i, x := range c {
		if !inPool(x) || !x.hasRoom() {
			continue
		}
		if best < 0 || x.Sessions > c[best].Sessions {
			best = i
		}
	}
	return best
}
