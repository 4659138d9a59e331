// Package history records what clients saw — every admission and release of a request slot,
// every session create, read, promote, end and delete, with its call and return times taken on
// the client's side — and checks it:
//
//   - the cap (CheckCap): at no instant were more exchanges certainly in flight than the cap.
//     An exchange is certainly in flight from the return of its admission (it was admitted by
//     then) to the call of its release (it had not ended before); counting those intervals
//     needs no model, only arithmetic.
//   - session writes linearizable per key (CheckSessions, porcupine; sessions.go);
//   - read-your-writes per replica and cross-replica staleness within a stated bound
//     (CheckReads).
//
// Times are monotonic offsets from the recorder's start. A Recorder is safe for concurrent
// use. Test-only.
package history

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Recorder collects a history.
type Recorder struct {
	start time.Time

	mu    sync.Mutex
	slots []Slot
}

// New returns an empty recorder whose clock starts now.
func New() *Recorder { return &Recorder{start: time.Now()} }

// Now is the recorder's clock (monotonic, since New).
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Slot is one exchange's hold on a request slot of a resource (an instance).
type Slot struct {
	Resource string
	Client   string // who asked (a replica)
	// Admitted is when the admission returned; Released when the release was called
	// (Open: never, the exchange was still in flight at the end).
	Admitted, Released time.Duration
}

// Open marks a slot never released within the history.
const Open = time.Duration(1<<63 - 1)

// Admission is one admitted exchange in progress; Release records its end once.
type Admission struct {
	r    *Recorder
	i    int
	once sync.Once
}

// Admit records an admission that returned now (call it right after the admission succeeded).
func (r *Recorder) Admit(resource, client string) *Admission {
	at := r.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slots = append(r.slots, Slot{Resource: resource, Client: client, Admitted: at, Released: Open})
	return &Admission{r: r, i: len(r.slots) - 1}
}

// Release records that the exchange's release is called now (call it right before releasing).
func (a *Admission) Release() {
	a.once.Do(func() {
		at := a.r.Now()
		a.r.mu.Lock()
		a.r.slots[a.i].Released = at
		a.r.mu.Unlock()
	})
}

// Held records a hold known afterwards: from (an admission's return) to to (the last instant
// it was certainly still held; Open: to the end). For holds that no single call ends, such as
// a session's slot, certainly held from its creation's return to the call of its last request
// served.
func (r *Recorder) Held(resource, client string, from, to time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slots = append(r.slots, Slot{Resource: resource, Client: client, Admitted: from, Released: to})
}

// Slots returns a copy of the recorded slots.
func (r *Recorder) Slots() []Slot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.slots)
}

// Peak is the result of CheckCap for one resource.
type Peak struct {
	Resource string
	Max      int           // most exchanges certainly in flight at once
	At       time.Duration // when that was first reached
	ByClient map[string]int
}

// CheckCap counts, per resource, the exchanges certainly in flight at every instant and returns
// the peaks and an error naming every resource whose peak exceeded cap(resource).
func (r *Recorder) CheckCap(cap func(resource string) int) ([]Peak, error) {
	type ev struct {
		at     time.Duration
		delta  int
		client string
	}
	byRes := map[string][]ev{}
	for _, s := range r.Slots() {
		if s.Released != Open && s.Released <= s.Admitted {
			continue // released as soon as admitted: never certainly in flight
		}
		byRes[s.Resource] = append(byRes[s.Resource], ev{s.Admitted, +1, s.Client}, ev{s.Released, -1, s.Client})
	}
	var peaks []Peak
	var errs []string
	for res, evs := range byRes {
		// Releases before admissions at the same instant: touching intervals do not overlap.
		slices.SortFunc(evs, func(a, b ev) int {
			if a.at != b.at {
				if a.at < b.at {
					return -1
				}
				return 1
			}
			return a.delta - b.delta
		})
		p := Peak{Resource: res}
		n := 0
		per := map[string]int{}
		for _, e := range evs {
			n += e.delta
			per[e.client] += e.delta
			if n > p.Max {
				p.Max, p.At = n, e.at
				p.ByClient = map[string]int{}
				for c, k := range per {
					if k > 0 {
						p.ByClient[c] = k
					}
				}
			}
		}
		peaks = append(peaks, p)
		if c := cap(res); p.Max > c {
			errs = append(errs, fmt.Sprintf("%s: %d exchanges certainly in flight at %v (by client %v), cap %d", res, p.Max, p.At, p.ByClient, c))
		}
	}
	slices.SortFunc(peaks, func(a, b Peak) int {
		if a.Resource < b.Resource {
			return -1
		}
		if a.Resource > b.Resource {
			return 1
		}
		return 0
	})
	slices.Sort(errs)
	if len(errs) > 0 {
		return peaks, fmt.Errorf("history: the cap was exceeded: %v", errs)
	}
	return peaks, nil
}
