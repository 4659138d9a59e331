package affinity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// Sentinel errors of the engine's management API, checked with errors.Is. They are always
// wrapped with a message saying what was wrong.
var (
	// ErrUnknownService: the named service is not in the registry.
	ErrUnknownService = errors.New("unknown service")
	// ErrUnsupported: the operation does not apply to the service's affinity mode.
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalidArgument: an argument is out of range or malformed.
	ErrInvalidArgument = errors.New("invalid argument")
)

// Defaults applied when an option is not given.
const (
	DefaultRetryAfter         = time.Second
	DefaultMaxRequestLifetime = time.Hour
	DefaultSweepInterval      = time.Second
	dcrPollInterval           = 2 * time.Second
)

// ScaleOut is the signal the engine emits when a new session had to go to a standby instance
// because every active instance was full.
type ScaleOut struct {
	Service string
	// Instance is the standby instance that received the session.
	Instance registry.Instance
	// Desired is the service's desired instance count at that moment (see DesiredInstances).
	Desired int
}

// Option configures an Engine.
type Option func(*Engine)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(e *Engine) { e.log = l } }

// WithClock sets the clock used for session times and the leak guard; the default is time.Now.
// Give the session store the same clock.
func WithClock(now func() time.Time) Option { return func(e *Engine) { e.now = now } }

// WithScaleOutHook sets a function called (synchronously, on the deciding goroutine) each time
// a new session opens a standby instance (its first session, every active instance being full). It must be fast and must not call the Engine.
func WithScaleOutHook(f func(ScaleOut)) Option { return func(e *Engine) { e.scaleOut = f } }

// WithRetryAfter sets the retry hint of ClassTooManyRequests and ClassNoCapacity rejections
// (default 1 s).
func WithRetryAfter(d time.Duration) Option { return func(e *Engine) { e.retryAfter = d } }

// WithMaxRequestLifetime sets the limit of an exchange that is not a stream: one still open
// this long after Decide is told to end (Decision.OnExpire), counted (ExpiredExchanges) and
// logged by Run's sweeper; its request slot is freed when it really ends (default 1 h).
// Streams (SSE responses) are bounded by their service's maxLifetime instead.
func WithMaxRequestLifetime(d time.Duration) Option {
	return func(e *Engine) { e.maxRequestLifetime = d }
}

// WithSweepInterval sets how often Run's sweeper walks the open decisions to enforce the leak
// guard and to refresh the idle timer of sessions that have a request in flight (default 1 s).
func WithSweepInterval(d time.Duration) Option { return func(e *Engine) { e.sweepInterval = d } }

// Engine decides where each request goes. See the package documentation for the semantics.
// All methods are safe for concurrent use.
type Engine struct {
	reg   *registry.Registry
	store session.Store
	log   *slog.Logger
	now   func() time.Time

	scaleOut           func(ScaleOut)
	retryAfter         time.Duration
	maxRequestLifetime time.Duration
	sweepInterval      time.Duration

	view atomic.Pointer[view]
	// applied is closed (and replaced) each time a view is published: Sync waits on it.
	applied atomic.Pointer[chan struct{}]
	// following counts running Run loops: while one runs, only it rebuilds views.
	following atomic.Int32

	mu sync.Mutex // serializes view rebuilds; guards slots
	// slots holds every instance's counters by key. Entries outlive their instance while
	// sessions or requests still count on them, so an instance that is removed and comes back
	// keeps an exact count.
	slots map[registry.Key]*balance.Slots
	// streams counts each instance's long-lived MCP streams (registry.StreamsPerInstance);
	// per replica, like the leak guard. Guarded by mu like slots.
	streams map[registry.Key]*balance.Slots
	// slotSource and slotStore are set with WithSharedSlots: counters shared with other
	// replicas (see there); nil means this process's own.
	slotSource SlotSource
	slotStore  session.SlotStore

	open    openSet
	limiter *clientLimiter // nil: new sessions per client not limited
	credits mintCredits    // prefix-handle mints awaiting their handle's first use (mcp_handle.go)
	// provisionalIdle is the idle timeout of a request-created session until its client
	// returns with it (0: off).
	provisionalIdle time.Duration
	expiredCount    atomic.Uint64           // exchanges told to end for outliving their limit
	dcr             map[string]*dcr.Watcher // by file path; guarded by mu
	dcrFailed       map[string]string       // last load error by file path; guarded by mu
}

// New returns an Engine over the registry and the session store. Sessions already in the store
// (a restored snapshot) are counted into their instances' session slots.
//
// New sets itself as the store's end handler (session.Store.SetEndHandler), so every session
// that leaves Active frees its slot.
func New(reg *registry.Registry, store session.Store, opts ...Option) (*Engine, error) {
	if reg == nil || store == nil {
		return nil, fmt.Errorf("affinity: registry and store are required: %w", ErrInvalidArgument)
	}
	e := &Engine{
		reg:                reg,
		store:              store,
		log:                slog.New(slog.DiscardHandler),
		now:                time.Now,
		retryAfter:         DefaultRetryAfter,
		maxRequestLifetime: DefaultMaxRequestLifetime,
		sweepInterval:      DefaultSweepInterval,
		slots:              map[registry.Key]*balance.Slots{},
		streams:            map[registry.Key]*balance.Slots{},
		dcr:                map[string]*dcr.Watcher{},
		dcrFailed:          map[string]string{},
	}
	first := make(chan struct{})
	e.applied.Store(&first)
	for _, o := range opts {
		o(e)
	}
	if e.slotSource != nil {
		ss, ok := store.(session.SlotStore)
		if !ok {
			return nil, fmt.Errorf("affinity: shared slots need a store that counts session slots (session.SlotStore): %w", ErrInvalidArgument)
		}
		e.slotStore = ss
	}
	if e.maxRequestLifetime <= 0 || e.sweepInterval <= 0 || e.retryAfter < 0 {
		return nil, fmt.Errorf("affinity: max request lifetime and sweep interval must be positive, retry-after not negative: %w", ErrInvalidArgument)
	}
	if _, err := e.rebuild(context.Background(), reg.Snapshot()); err != nil {
		return nil, err
	}
	store.SetEndHandler(e.storeEnded)
	return e, nil
}

// storeEnded receives the store's end notifications (session.Store, "End notification"): the
// end this handle made frees its slot once; an MCP session terminated through another replica
// (a DELETE, an instance loss) also ends this replica's open exchanges of it, as a local
// termination would.
func (e *Engine) storeEnded(ev session.EndEvent) {
	if ev.Local {
		e.sessionEnded(ev.Session)
		return
	}
	if k := ev.Session.Kind; ev.Session.Status == session.StatusTerminated && (k == session.KindMCPStreamable || k == session.KindMCPSSE) {
		e.open.endSession(ev.Session.Service, ev.Session.ID, nil)
	}
}

// Run follows registry generations (slot caps, hash tables, instance loss), reloads DCR files,
// and runs the sweeper (leak guard, idle refresh of sessions with requests in flight). It
// returns nil when ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	e.following.Add(1)
	defer e.following.Add(-1)
	watch := e.reg.Watch(ctx)
	tick := time.NewTicker(e.sweepInterval)
	defer tick.Stop()
	dcrTick := time.NewTicker(dcrPollInterval)
	defer dcrTick.Stop()
	var last *registry.Snapshot
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap, ok := <-watch:
			if !ok {
				return nil
			}
			if _, err := e.sync(ctx, snap); err != nil {
				e.log.Error("affinity: applying registry generation", "generation", snap.Generation, "err", err)
				continue
			}
			e.endLostMCPSessions(ctx, last, snap)
			last = snap
		case <-tick.C:
			// A generation whose rebuild failed (e.g. the store could not count an instance's
			// sessions) is retried here; the registry announces each generation once.
			if snap := e.reg.Snapshot(); e.view.Load().gen < snap.Generation {
				if _, err := e.sync(ctx, snap); err == nil {
					e.endLostMCPSessions(ctx, last, snap)
					last = snap
				}
			}
			e.sweep(ctx)
		case <-dcrTick.C:
			e.reloadDCR()
		}
	}
}

// ExpiredExchanges counts the exchanges told to end because they outlived their limit.
func (e *Engine) ExpiredExchanges() uint64 { return e.expiredCount.Load() }

// sessionEnded is called once for every session that leaves Active through this handle (the
// store's Local end notification): it frees the session's slot on its instance. Sticky
// sessions hold no slot.
func (e *Engine) sessionEnded(s session.Session) {
	if !holdsSlot(s.Kind) || e.slotStore != nil { // shared slots: the store freed it

		return
	}
	if sl := e.slotsOf(registry.Key{Service: s.Service, ID: s.Instance}); sl != nil {
		sl.ReleaseSession()
	}
}

// holdsSlot reports whether sessions of the kind hold a session slot.
func holdsSlot(k session.Kind) bool { return k != session.KindSticky }

// slotsOf returns the counters of an instance, present or recently removed, or nil.
func (e *Engine) slotsOf(k registry.Key) *balance.Slots {
	if v := e.view.Load(); v != nil {
		if st := v.services[k.Service]; st != nil {
			if i, ok := st.byID[k.ID]; ok {
				return st.slots[i]
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.slots[k]
}

// current returns a view at least as new as the registry's current generation (Sync): the
// SessionAPI and operator calls read their own writes. Decide never waits: it routes by the
// published view, which Run rebuilds when the registry announces a generation.
func (e *Engine) current(ctx context.Context) (*view, error) {
	if v := e.view.Load(); v.gen == e.reg.Snapshot().Generation {
		return v, nil
	}
	// Bounded: a generation Run cannot apply (it retries every sweep) must not hang an
	// operator call; the answer then comes from the view requests are routed by.
	wctx, cancel := context.WithTimeout(ctx, currentWait)
	defer cancel()
	if err := e.Sync(wctx); err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		e.log.Warn("affinity: answering from the previous registry generation", "err", err)
	}
	return e.view.Load(), nil
}

// currentWait bounds how long an operator call waits for a new generation to be applied.
const currentWait = 2 * time.Second

// Sync returns once the engine's view reflects the registry generation current at the call:
// it waits for Run to apply it, or applies it itself when no Run loop is running. Requests
// never rebuild the view; callers that change the registry and must route by the change at
// once (tests, an API that registers and then routes) call Sync.
func (e *Engine) Sync(ctx context.Context) error {
	snap := e.reg.Snapshot()
	for {
		ch := *e.applied.Load()
		if e.view.Load().gen >= snap.Generation {
			return nil
		}
		if e.following.Load() == 0 {
			_, err := e.sync(ctx, snap)
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("affinity: waiting for registry generation %d: %w", snap.Generation, ctx.Err())
		}
	}
}

// sync makes the view follow snap unless it is already at or past it.
func (e *Engine) sync(ctx context.Context, snap *registry.Snapshot) (*view, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if v := e.view.Load(); v != nil && v.gen >= snap.Generation {
		return v, nil
	}
	return e.rebuildLocked(ctx, snap)
}

func (e *Engine) rebuild(ctx context.Context, snap *registry.Snapshot) (*view, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rebuildLocked(ctx, snap)
}

// endLostMCPSessions ends the sessions of modes with endOnInstanceLoss (MCP) bound to instances
// that stopped being routable (or disappeared) between two generations: their clients must
// re-initialise. Cookie and header sessions are rebound lazily on their next request instead.
func (e *Engine) endLostMCPSessions(ctx context.Context, prev, next *registry.Snapshot) {
	for _, svc := range next.Services() {
		if !modeFor(normalized(svc)).endOnInstanceLoss {
			continue
		}
		var lost []string
		if prev == nil {
			// First generation Run sees (e.g. after a restore): sessions on instances that are
			// not routable now can never be served.
			for _, in := range next.Instances(svc.Name) {
				if !in.Routable() {
					lost = append(lost, in.ID)
				}
			}
		} else {
			for _, in := range prev.Instances(svc.Name) {
				now, ok := next.Instance(in.Key())
				if in.Routable() && (!ok || !now.Routable()) {
					lost = append(lost, in.ID)
				}
			}
		}
		for _, id := range lost {
			e.endInstanceSessions(ctx, svc.Name, id)
		}
	}
}

// endInstanceSessions terminates every Active session on an instance and releases the request
// slots of their open exchanges.
func (e *Engine) endInstanceSessions(ctx context.Context, service, instance string) {
	list, err := e.store.ActiveByInstance(ctx, service, instance)
	if err != nil {
		e.log.Error("affinity: listing sessions of a lost instance", "service", service, "instance", instance, "err", err)
		return
	}
	for _, s := range list {
		e.terminate(ctx, s.Service, s.ID, "instance lost", nil)
	}
	if len(list) > 0 {
		e.log.Info("affinity: ended MCP sessions of a lost instance", "service", service, "instance", instance, "sessions", len(list))
	}
}

// terminate ends an Active session as Terminated and ends the open decisions of that session.
// except (may be nil) is left open: the exchange that asked for the termination.
func (e *Engine) terminate(ctx context.Context, service, id, why string, except *decision) {
	if _, err := e.store.End(ctx, service, id, session.StatusTerminated, e.now()); err != nil &&
		!errors.Is(err, session.ErrEnded) && !errors.Is(err, session.ErrNotFound) {
		e.log.Error("affinity: terminating session", "service", service, "session", id, "reason", why, "err", err)
	}
	e.open.endSession(service, id, except)
}

func (e *Engine) reject(c Class, code, msg string) *Reject {
	r := &Reject{Class: c, Code: code, Message: msg}
	if c == ClassTooManyRequests || c == ClassNoCapacity {
		r.RetryAfter = e.retryAfter
	}
	return r
}
