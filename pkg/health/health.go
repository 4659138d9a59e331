// Package health runs active HTTP health checks against instances and records their verdicts
// in the registry with SetHealth.
//
// Probes reach only addresses the registry's AddressPolicy allows: the registry publishes no
// other instance, and the default transport checks the address it dials again.
//
// A Checker follows the registry's generations: every instance of a service whose HealthCheck
// is enabled (interval > 0) and that has an HTTP port gets its own prober goroutine. Instances
// that appear start a prober, instances that disappear stop theirs, and a changed address or
// check setting restarts it. Probers never hold a registry lock while probing; the registry
// never waits for a probe.
//
// Verdicts follow thresholds as Envoy's HTTP health checker does: an instance with no verdict
// yet (HealthUnknown) becomes healthy after one passing check; a healthy (or unknown) instance
// becomes unhealthy after UnhealthyThreshold consecutive failures; an unhealthy one becomes
// healthy again after HealthyThreshold consecutive passes. A check passes when GET
// http://address:httpPort/path answers 2xx within Timeout; redirects are not followed, and
// errors, timeouts and other status codes fail. When checks are turned off for an instance
// that remains, its health goes back to HealthUnknown.
//
// # One checker for several replicas
//
// With WithLease (replicas sharing Redis), the checkers of all replicas elect one: a checker
// probes only while it holds the lease, which it renews every TTL/3 and gives up (stopping
// every prober) as soon as a renewal says another holds it, or when renewals have failed for
// half the TTL — before it can expire — so two checkers never probe at once. Its verdicts go
// to the registry's shared admin layer (pkg/fleet), which every replica applies. When the
// holder dies its lease expires after the TTL; the others try to take it every TTL/10, so one
// of them probes within TTL + TTL/10, and its probers start from the verdicts the fleet
// already has (an instance's first check waits a random part of the interval). A holder that
// stops gracefully (Run's ctx ends) releases the lease: another probes within TTL/10.
//
// Worst case for a health change to reach every replica, with Interval i, thresholds n and
// timeout t: n·i + t (the checks) plus one change message (a few Redis round trips; a missed
// message within the fleet's resync interval). When the holder has just died, add
// TTL + TTL/10 + i (takeover and the first check's jitter).
//
// When the lease store has not answered for a TTL, no replica can be elected: each replica
// then checks on its own (Local) and keeps its verdicts to itself (registry.SetHealthLocal),
// so health does not freeze during a Redis outage; the election resumes as soon as the store
// answers, and the shared verdicts replace the local ones.
package health

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
)

// Checker runs health checks for the instances of one registry. Create it with New and start
// it with Run; its methods are safe for concurrent use.
type Checker struct {
	reg       *registry.Registry
	log       *slog.Logger
	transport http.RoundTripper
	jitter    func(interval time.Duration) time.Duration

	lease    Lease
	leaseTTL time.Duration
	leading  atomic.Bool
	local    atomic.Bool

	mu     sync.Mutex
	probes map[registry.Key]*prober // guarded by mu; written only by Run's goroutine
}

// Lease elects one checker among replicas: Hold takes or renews the lease for ttl and reports
// whether this replica holds it; Release gives it up if this replica holds it (a graceful stop,
// so another replica takes over at once). redisstore.Store's HoldLease and ReleaseLease under
// one name are such a lease.
type Lease interface {
	Hold(ctx context.Context, ttl time.Duration) (bool, error)
	Release(ctx context.Context) error
}

// DefaultLeaseTTL is the checker lease's default TTL.
const DefaultLeaseTTL = 5 * time.Second

// WithLease makes the checker probe only while it holds l (see "One checker for several
// replicas"); ttl ≤ 0 means DefaultLeaseTTL. Without it the checker always probes.
func WithLease(l Lease, ttl time.Duration) Option {
	return func(c *Checker) {
		if ttl <= 0 {
			ttl = DefaultLeaseTTL
		}
		c.lease, c.leaseTTL = l, ttl
	}
}

// Option configures a Checker.
type Option func(*Checker)

// WithLogger sets the logger for health transitions and probe errors; the default discards.
func WithLogger(l *slog.Logger) Option { return func(c *Checker) { c.log = l } }

// WithTransport sets the HTTP transport used for checks. The default is a dedicated transport
// that ignores proxy environment variables and keeps one idle connection per instance.
func WithTransport(rt http.RoundTripper) Option { return func(c *Checker) { c.transport = rt } }

// WithJitter sets the function that delays an instance's first check, given the check
// interval. The default picks a uniformly random delay in [0, interval), so that instances
// added together are not probed in lock step.
func WithJitter(f func(interval time.Duration) time.Duration) Option {
	return func(c *Checker) { c.jitter = f }
}

// New returns a Checker for reg. It does nothing until Run.
func New(reg *registry.Registry, opts ...Option) *Checker {
	c := &Checker{
		reg:    reg,
		log:    slog.New(slog.DiscardHandler),
		probes: map[registry.Key]*prober{},
		jitter: func(d time.Duration) time.Duration {
			if d <= 0 {
				return 0
			}
			return rand.N(d)
		},
	}
	for _, o := range opts {
		o(c)
	}
	if c.transport == nil {
		c.transport = &http.Transport{
			Proxy:               nil, // health checks go straight to the instance
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, Control: c.allowedDial}).DialContext,
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
	}
	return c
}

// allowedDial refuses a connection the registry's address policy would not let an instance
// have: the registry publishes no such instance, and the default transport's dialer checks the
// address it really connects to again (a probe reaches only what Envoy may).
func (c *Checker) allowedDial(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("health check dial %s: %w", address, err)
	}
	return c.reg.AddressPolicy().CheckAddrPort(ap)
}

// target is what a prober checks; a change restarts the prober.
type target struct {
	addr string
	hc   registry.HealthCheck
}

type prober struct {
	target
	cancel context.CancelFunc
	done   chan struct{}
}

// Run follows the registry and runs the probers until ctx ends (with WithLease: while this
// checker holds the lease), then stops them all and returns nil once every prober goroutine
// has exited. Call Run once.
func (c *Checker) Run(ctx context.Context) error {
	if c.lease == nil {
		return c.run(ctx)
	}
	renew := time.NewTicker(c.leaseTTL / 3)
	defer renew.Stop()
	try := time.NewTicker(c.leaseTTL / 10)
	defer try.Stop()
	answered := time.Now() // when the lease store last answered
	for {
		held, err := c.hold(ctx)
		switch {
		case held:
			renew.Reset(c.leaseTTL / 3)
			answered = c.lead(ctx, renew.C)
		case err == nil:
			answered = time.Now()
		case ctx.Err() == nil && time.Since(answered) >= c.leaseTTL:
			c.alone(ctx, try.C)
			answered = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-try.C:
		}
	}
}

// alone runs the probers while the lease store cannot be reached (for a TTL already): no
// replica can be elected then, and health must not freeze. Verdicts the shared registry cannot
// take are kept on this replica (registry.SetHealthLocal) until it answers again. It returns
// as soon as the store answers (the election resumes).
func (c *Checker) alone(ctx context.Context, tick <-chan time.Time) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	c.local.Store(true)
	defer c.local.Store(false)
	go func() { defer close(done); _ = c.run(lctx) }()
	c.log.Warn("health checks: the lease store is unreachable; this replica checks on its own until it answers", "ttl", c.leaseTTL)
	for lctx.Err() == nil {
		select {
		case <-lctx.Done():
		case <-tick:
			if _, err := c.hold(ctx); err == nil {
				c.log.Info("health checks: the lease store answers again; electing one checker")
				cancel()
			}
		}
	}
	<-done
}

// Local reports whether the checker probes on its own because the lease store is unreachable.
func (c *Checker) Local() bool { return c.local.Load() }

// Leading reports whether this checker probes (it holds the lease, or has no lease to hold).
func (c *Checker) Leading() bool { return c.leading.Load() }

func (c *Checker) hold(ctx context.Context) (bool, error) {
	hctx, cancel := context.WithTimeout(ctx, c.leaseTTL/4)
	defer cancel()
	held, err := c.lease.Hold(hctx, c.leaseTTL)
	if err != nil && ctx.Err() == nil {
		c.log.Debug("health check lease", "err", err)
	}
	return held && err == nil, err
}

// lead runs the probers while the lease is renewed, and stops them when it is lost (another
// holds it) or renewals have failed for half the TTL (a renewal waits TTL/4 at most, so the
// probers stop at least a quarter of the TTL before the lease can expire).
// It returns when the lease store last answered a renewal.
func (c *Checker) lead(ctx context.Context, tick <-chan time.Time) time.Time {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.run(lctx) }()
	c.log.Info("health checks: this replica checks (it holds the lease)", "ttl", c.leaseTTL)
	last := time.Now()
	for lctx.Err() == nil {
		select {
		case <-lctx.Done():
		case <-tick:
			start := time.Now()
			held, err := c.hold(ctx)
			switch {
			case held:
				last = start
			case err == nil:
				c.log.Info("health checks: another replica holds the lease; stopping")
				cancel()
			case time.Since(last) >= c.leaseTTL/2:
				c.log.Warn("health checks: cannot renew the lease; stopping before it expires", "err", err)
				cancel()
			}
		}
	}
	cancel()
	<-done
	if ctx.Err() != nil { // stopping: hand the lease over rather than let it lapse
		rctx, rcancel := context.WithTimeout(context.Background(), c.leaseTTL/4)
		if err := c.lease.Release(rctx); err != nil {
			c.log.Debug("health check lease: release", "err", err)
		}
		rcancel()
	}
	return last
}

// run follows the registry and runs the probers until ctx ends.
func (c *Checker) run(ctx context.Context) error {
	c.leading.Store(true)
	defer c.leading.Store(false)
	client := &http.Client{
		Transport: c.transport,
		// A redirect is an answer, not a pass: do not follow it to somewhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	for snap := range c.reg.Watch(ctx) {
		c.reconcile(ctx, client, snap)
	}
	c.mu.Lock()
	keys := sortedKeys(c.probes)
	c.mu.Unlock()
	for _, k := range keys {
		c.stop(k)
	}
	if t, ok := c.transport.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
	return nil
}

// Probing returns the keys of the instances being checked, sorted.
func (c *Checker) Probing() []registry.Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	return sortedKeys(c.probes)
}

func sortedKeys[V any](m map[registry.Key]V) []registry.Key {
	keys := make([]registry.Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b registry.Key) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.ID, b.ID))
	})
	return keys
}

// reconcile makes the running probers match snap.
func (c *Checker) reconcile(ctx context.Context, client *http.Client, snap *registry.Snapshot) {
	want := map[registry.Key]target{}
	for _, s := range snap.Services() {
		if !s.HealthCheck.Enabled() {
			continue
		}
		for _, in := range snap.Instances(s.Name) {
			if in.HTTPPort > 0 {
				want[in.Key()] = target{addr: in.HTTPAddr(), hc: s.HealthCheck}
			}
		}
	}
	c.mu.Lock()
	running := sortedKeys(c.probes)
	c.mu.Unlock()
	for _, k := range running {
		c.mu.Lock()
		p := c.probes[k]
		c.mu.Unlock()
		t, ok := want[k]
		if ok && t == p.target {
			continue
		}
		c.stop(k)
		if _, still := snap.Instance(k); still && !ok {
			// Checks were turned off: the last verdict would go stale, so forget it.
			if _, err := c.reg.SetHealth(k, registry.HealthUnknown); err != nil && !errors.Is(err, registry.ErrUnknownInstance) {
				c.log.Error("reset health", "service", k.Service, "instance", k.ID, "err", err)
			}
		}
	}
	for _, k := range sortedKeys(want) {
		c.mu.Lock()
		_, running := c.probes[k]
		c.mu.Unlock()
		if running {
			continue
		}
		in, _ := snap.Instance(k)
		pctx, cancel := context.WithCancel(ctx)
		p := &prober{target: want[k], cancel: cancel, done: make(chan struct{})}
		c.mu.Lock()
		c.probes[k] = p
		c.mu.Unlock()
		go c.probe(pctx, client, k, p, in.Health)
	}
}

// stop cancels a prober and waits for it to exit, so no verdict of the old prober can land
// after its replacement starts. A probe in flight is cancelled with it, so this is quick.
func (c *Checker) stop(k registry.Key) {
	c.mu.Lock()
	p := c.probes[k]
	c.mu.Unlock()
	p.cancel()
	<-p.done
	c.mu.Lock()
	delete(c.probes, k)
	c.mu.Unlock()
}

// probe checks one instance every interval until ctx ends. state is the instance's health
// when the prober started (kept across a restart caused by a changed setting).
func (c *Checker) probe(ctx context.Context, client *http.Client, k registry.Key, p *prober, state registry.Health) {
	defer close(p.done)
	hc := p.hc
	url := "http://" + p.addr + hc.Path
	log := c.log.With("service", k.Service, "instance", k.ID, "url", url)
	timer := time.NewTimer(c.jitter(hc.Interval))
	defer timer.Stop()
	passes, fails := 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		start := time.Now()
		err := check(ctx, client, url, hc.Timeout)
		if ctx.Err() != nil {
			return // stopped mid-check: no verdict
		}
		if err == nil {
			passes, fails = passes+1, 0
		} else {
			passes, fails = 0, fails+1
			log.Debug("health check failed", "err", err, "consecutive", fails)
		}
		if next := verdict(state, err, passes, fails, hc); next != state {
			state = c.record(k, log, state, next, err, passes, fails)
		}
		timer.Reset(max(0, hc.Interval-time.Since(start)))
	}
}

// verdict is the health after a check that ended in err, with passes and fails consecutive
// results so far, for an instance whose health was state.
func verdict(state registry.Health, err error, passes, fails int, hc registry.HealthCheck) registry.Health {
	switch {
	case err == nil && state != registry.HealthHealthy && (state == registry.HealthUnknown || passes >= hc.HealthyThreshold):
		return registry.HealthHealthy
	case err != nil && state != registry.HealthUnhealthy && fails >= hc.UnhealthyThreshold:
		return registry.HealthUnhealthy
	}
	return state
}

// record records the verdict next for k (locally while the shared registry is unreachable)
// and returns the health the prober goes on from: next, or state if it was not recorded
// (the next check tries again).
func (c *Checker) record(k registry.Key, log *slog.Logger, state, next registry.Health, err error, passes, fails int) registry.Health {
	_, serr := c.reg.SetHealth(k, next)
	if errors.Is(serr, registry.ErrUnavailable) {
		// The shared registry is unreachable: keep the verdict here until it answers.
		_, serr = c.reg.SetHealthLocal(k, next)
	}
	switch {
	case errors.Is(serr, registry.ErrUnknownInstance):
		// The instance left the registry; reconcile is about to stop this prober.
		log.Debug("record health", "err", serr)
	case serr != nil:
		// Not recorded (the shared registry is unreachable): the next check tries again.
		log.Warn("record health", "health", next, "err", serr)
		return state
	case next == registry.HealthUnhealthy:
		log.Warn("instance unhealthy", "err", err, "failures", fails)
	default:
		log.Info("instance healthy", "passes", passes)
	}
	return next
}

// check performs one HTTP check: nil for a 2xx answer within timeout.
func check(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "tether-health-check")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	// Read (a bounded amount of) the body so the connection can be reused.
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close() // read above; a close error says nothing about health
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}
