// Package calls counts the SIP calls each instance carries, as Kamailio's call-load dispatcher
// (algorithm 10, ds_load_update / ds_load_unset) and OpenSIPS's load_balancer do: a call is
// counted on its instance from the moment tether decides its initial INVITE, confirmed when
// the proxy reports it answered (a 2xx), and uncounted when the proxy reports it ended (BYE,
// CANCEL or a negative final reply). A call that is never reported ended expires: after
// SetupTTL while unanswered, after TTL once answered (Kamailio's ds_hash_expire, 2 h). An
// optional per-instance cap refuses a new call on an instance that already carries that many.
//
// Calls are keyed by (service, Call-ID). The tracker is in-memory and per tether process: the
// proxy reports to the replica it asks. It is safe for concurrent use.
package calls

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Defaults of the options.
const (
	// DefaultTTL is how long an answered call lives without an end report (Kamailio's
	// ds_hash_expire default).
	DefaultTTL = 2 * time.Hour
	// DefaultSetupTTL is how long a decided call waits for its answer report.
	DefaultSetupTTL = 5 * time.Minute
	// DefaultMaxCalls bounds the calls tracked at once, over all services.
	DefaultMaxCalls = 1_000_000
)

// Errors. Check them with errors.Is.
var (
	// ErrCallCap means the instance already carries its cap of calls.
	ErrCallCap = errors.New("instance is at its call cap")
	// ErrTooManyCalls means the tracker holds MaxCalls calls.
	ErrTooManyCalls = errors.New("too many calls tracked")
	// ErrUnknownCall means no call with that Call-ID is tracked (never decided, already
	// ended or expired).
	ErrUnknownCall = errors.New("unknown call")
	// ErrSourceLimit means the call's source already holds its service's SourceSetup calls in
	// setup (decided, not answered yet).
	ErrSourceLimit = errors.New("source holds too many calls in setup")
	// ErrInvalid means an empty service, instance or Call-ID.
	ErrInvalid = errors.New("invalid call")
)

// State is a tracked call's state.
type State string

// States.
const (
	// Setup: the initial INVITE was decided; no answer reported yet.
	Setup State = "setup"
	// Answered: the proxy reported a 2xx.
	Answered State = "answered"
)

// Call is one tracked call.
type Call struct {
	Service  string
	CallID   string
	Instance string
	// Source is the client bucket the call came from (BeginFrom), "" when not given.
	Source string
	State  State
	// Began is when the call was decided; Answered when it was reported answered (zero in
	// Setup).
	Began, AnsweredAt time.Time
}

// Load is one instance's call count.
type Load struct {
	Instance string `json:"instance"`
	// Setup and Answered count the instance's calls in each state.
	Setup    int `json:"setup"`
	Answered int `json:"answered"`
	// Cap is the per-instance cap (0: none).
	Cap int `json:"cap"`
}

// Total is Setup + Answered: what the cap counts.
func (l Load) Total() int { return l.Setup + l.Answered }

// Option configures a Tracker.
type Option func(*Tracker)

// WithTTL sets how long an answered call lives without an end report (default DefaultTTL).
func WithTTL(d time.Duration) Option {
	return func(t *Tracker) {
		if d > 0 {
			t.ttl = d
		}
	}
}

// WithSetupTTL sets how long a decided call waits for its answer (default DefaultSetupTTL).
func WithSetupTTL(d time.Duration) Option {
	return func(t *Tracker) {
		if d > 0 {
			t.setupTTL = d
		}
	}
}

// WithMaxCalls bounds the calls tracked at once (default DefaultMaxCalls).
func WithMaxCalls(n int) Option {
	return func(t *Tracker) {
		if n > 0 {
			t.maxCalls = n
		}
	}
}

// WithClock sets the clock (tests).
func WithClock(now func() time.Time) Option { return func(t *Tracker) { t.now = now } }

type callKey struct{ service, callID string }

type instKey struct{ service, instance string }

type srcKey struct{ service, source string }

// Tracker counts calls per instance. The zero value is not usable; call New.
type Tracker struct {
	ttl, setupTTL time.Duration
	maxCalls      int
	now           func() time.Time

	mu     sync.Mutex
	calls  map[callKey]*Call
	load   map[instKey]*Load
	limits map[string]Limits // per service; absent: no cap, the tracker's TTLs
	setup  map[srcKey]int    // calls in Setup per (service, source), sources given only
}

// Limits are one service's call settings.
type Limits struct {
	// Cap is the per-instance call cap (0: none).
	Cap int
	// TTL and SetupTTL override the tracker's (0: the tracker's).
	TTL, SetupTTL time.Duration
	// SourceSetup is the most calls in setup one source (BeginFrom) may hold in the service
	// at a time (0: no limit): a source sending INVITEs that are never answered holds at most
	// this many of the instances' call caps until SetupTTL frees them.
	SourceSetup int
}

// New returns an empty tracker.
func New(opts ...Option) *Tracker {
	t := &Tracker{ttl: DefaultTTL, setupTTL: DefaultSetupTTL, maxCalls: DefaultMaxCalls, now: time.Now,
		calls: map[callKey]*Call{}, load: map[instKey]*Load{}, limits: map[string]Limits{}, setup: map[srcKey]int{}}
	for _, o := range opts {
		o(t)
	}
	return t
}

// Tracked reports whether service has limits set (SetLimits or SetCap): the services whose
// calls a decision endpoint counts.
func (t *Tracker) Tracked(service string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.limits[service]
	return ok
}

// Untrack forgets service's limits: Tracked is false from now on. Calls already tracked stay
// until they end or expire (with the tracker's TTLs).
func (t *Tracker) Untrack(service string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.limits, service)
}

// SetCap sets the per-instance call cap of service (0: none), keeping its TTLs. Calls already
// tracked stay.
func (t *Tracker) SetCap(service string, limit int) {
	t.mu.Lock()
	l := t.limits[service]
	t.mu.Unlock()
	l.Cap = limit
	t.SetLimits(service, l)
}

// SetLimits sets service's call settings (a config reload calls it again). Calls already
// tracked stay; the new TTLs apply to their next expiry check.
func (t *Tracker) SetLimits(service string, l Limits) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l.Cap = max(l.Cap, 0)
	t.limits[service] = l
	for k, ld := range t.load {
		if k.service == service {
			ld.Cap = l.Cap
		}
	}
}

// Begin counts a new call on instance. A call already tracked under the same Call-ID (a
// retransmitted INVITE asked again) is not counted twice: Begin returns the instance it is on.
// With the instance at its cap, Begin returns ErrCallCap and counts nothing.
func (t *Tracker) Begin(service, instance, callID string) (string, error) {
	return t.BeginFrom(service, instance, callID, "")
}

// BeginFrom is Begin for a call from source (a client bucket, e.g. affinity.ClientBucket of
// the SIP client's address; "" for none): with the service's SourceSetup set and the source
// already holding that many calls in setup, it returns ErrSourceLimit and counts nothing.
func (t *Tracker) BeginFrom(service, instance, callID, source string) (string, error) {
	if service == "" || instance == "" || callID == "" {
		return "", fmt.Errorf("%w: service, instance and Call-ID are required", ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := callKey{service, callID}
	if c, ok := t.calls[k]; ok {
		return c.Instance, nil
	}
	if len(t.calls) >= t.maxCalls {
		return "", fmt.Errorf("%w (%d)", ErrTooManyCalls, t.maxCalls)
	}
	l := t.loadOf(service, instance)
	if l.Cap > 0 && l.Total() >= l.Cap {
		return "", fmt.Errorf("%w: %s/%s carries %d calls", ErrCallCap, service, instance, l.Total())
	}
	sk := srcKey{service, source}
	if lim := t.limits[service].SourceSetup; source != "" && lim > 0 && t.setup[sk] >= lim {
		if l.Total() == 0 {
			delete(t.load, instKey{service, instance})
		}
		return "", fmt.Errorf("%w: %s holds %d calls of %s in setup", ErrSourceLimit, source, t.setup[sk], service)
	}
	t.calls[k] = &Call{Service: service, CallID: callID, Instance: instance, Source: source, State: Setup, Began: t.now()}
	l.Setup++
	if source != "" {
		t.setup[sk]++
	}
	return instance, nil
}

// loadOf returns the load record of (service, instance), creating it; t.mu is held.
func (t *Tracker) loadOf(service, instance string) *Load {
	k := instKey{service, instance}
	l, ok := t.load[k]
	if !ok {
		l = &Load{Instance: instance, Cap: t.limits[service].Cap}
		t.load[k] = l
	}
	return l
}

// Answered marks a call answered (idempotent). It returns ErrUnknownCall for a call not
// tracked.
func (t *Tracker) Answered(service, callID string) (Call, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.calls[callKey{service, callID}]
	if !ok {
		return Call{}, fmt.Errorf("%w: %s %q", ErrUnknownCall, service, callID)
	}
	if c.State == Setup {
		l := t.loadOf(service, c.Instance)
		l.Setup--
		l.Answered++
		t.unsetupLocked(c)
		c.State = Answered
		c.AnsweredAt = t.now()
	}
	return *c, nil
}

// Ended stops counting a call. It returns ErrUnknownCall for a call not tracked (already
// ended, expired or never decided), so a repeated report changes nothing.
func (t *Tracker) Ended(service, callID string) (Call, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := callKey{service, callID}
	c, ok := t.calls[k]
	if !ok {
		return Call{}, fmt.Errorf("%w: %s %q", ErrUnknownCall, service, callID)
	}
	t.remove(k, c)
	return *c, nil
}

// remove uncounts c; t.mu is held.
func (t *Tracker) remove(k callKey, c *Call) {
	delete(t.calls, k)
	ik := instKey{c.Service, c.Instance}
	l := t.load[ik]
	if c.State == Setup {
		l.Setup--
		t.unsetupLocked(c)
	} else {
		l.Answered--
	}
	if l.Total() == 0 {
		delete(t.load, ik)
	}
}

// unsetupLocked uncounts a Setup call from its source; t.mu is held.
func (t *Tracker) unsetupLocked(c *Call) {
	if c.Source == "" {
		return
	}
	sk := srcKey{c.Service, c.Source}
	if t.setup[sk]--; t.setup[sk] <= 0 {
		delete(t.setup, sk)
	}
}

// Get returns the tracked call, if any.
func (t *Tracker) Get(service, callID string) (Call, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.calls[callKey{service, callID}]
	if !ok {
		return Call{}, false
	}
	return *c, true
}

// Loads returns the call load of every instance of service that carries calls, sorted by
// instance id.
func (t *Tracker) Loads(service string) []Load {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Load
	for k, l := range t.load {
		if k.service == service {
			out = append(out, *l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Instance < out[j].Instance })
	return out
}

// Expire ends the calls whose reports are overdue at now — Setup calls older than SetupTTL,
// Answered calls answered longer than TTL ago — and returns them.
func (t *Tracker) Expire(now time.Time) []Call {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Call
	for k, c := range t.calls {
		ttl, setupTTL := t.ttl, t.setupTTL
		if l, ok := t.limits[c.Service]; ok {
			ttl, setupTTL = cmp.Or(l.TTL, ttl), cmp.Or(l.SetupTTL, setupTTL)
		}
		overdue := c.State == Setup && now.Sub(c.Began) >= setupTTL ||
			c.State == Answered && now.Sub(c.AnsweredAt) >= ttl
		if overdue {
			t.remove(k, c)
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CallID < out[j].CallID })
	return out
}

// Run expires overdue calls every interval until ctx ends, calling onExpire (if not nil) with
// each batch.
func (t *Tracker) Run(ctx context.Context, interval time.Duration, onExpire func([]Call)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if ended := t.Expire(t.now()); len(ended) > 0 && onExpire != nil {
				onExpire(ended)
			}
		}
	}
}
