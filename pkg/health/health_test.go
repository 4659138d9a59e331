package health_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/health"
	"github.com/tether-dev/tether/pkg/registry"
)

type mode int

const (
	pass mode = iota
	fail
	hang
)

// arrival is one health-check request as the upstream saw it: the phase (mode switches so
// far), the mode it answered in, and the instance's health in the registry when it arrived.
type arrival struct {
	phase  int
	mode   mode
	health registry.Health
}

// upstream is a real HTTP server on loopback whose /healthz passes, fails (503) or hangs.
type upstream struct {
	srv  *httptest.Server
	reg  *registry.Registry
	key  registry.Key
	done chan struct{}

	mu       sync.Mutex
	phase    int
	mode     mode
	arrivals []arrival
}

func newUpstream(t *testing.T, reg *registry.Registry, k registry.Key) *upstream {
	t.Helper()
	u := &upstream{reg: reg, key: k, done: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := registry.HealthUnknown
		if in, ok := u.reg.Snapshot().Instance(u.key); ok {
			h = in.Health
		}
		u.mu.Lock()
		m := u.mode
		u.arrivals = append(u.arrivals, arrival{phase: u.phase, mode: m, health: h})
		u.mu.Unlock()
		switch m {
		case pass:
			w.WriteHeader(http.StatusOK)
		case fail:
			w.WriteHeader(http.StatusServiceUnavailable)
		case hang:
			select {
			case <-r.Context().Done():
			case <-u.done:
			}
		}
	}))
	t.Cleanup(func() { close(u.done); u.srv.Close() })
	return u
}

func (u *upstream) port() int { return u.srv.Listener.Addr().(*net.TCPAddr).Port }

func (u *upstream) set(m mode) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.phase++
	u.mode = m
}

// inPhase returns the arrivals of the current phase.
func (u *upstream) inPhase() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []arrival
	for _, a := range u.arrivals {
		if a.phase == u.phase {
			out = append(out, a)
		}
	}
	return out
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.arrivals)
}

func service(hc registry.HealthCheck) registry.Service {
	return registry.Service{Name: "web", Affinity: registry.AffinityCookie, Balancing: registry.BalanceRoundRobin, HealthCheck: hc}
}

func instance(id string, port int) registry.Instance {
	return registry.Instance{Service: "web", ID: id, Address: "127.0.0.1", HTTPPort: port, Weight: 1, State: registry.StateActive}
}

func apply(t *testing.T, reg *registry.Registry, s registry.Service, ins ...registry.Instance) {
	t.Helper()
	if err := reg.Apply([]registry.Service{s}, ins); err != nil {
		t.Fatal(err)
	}
}

// run starts a checker with no jitter and stops it at cleanup. wait blocks until Run has
// returned and gives its result.
func run(t *testing.T, reg *registry.Registry, opts ...health.Option) (c *health.Checker, cancel context.CancelFunc, wait func() error) {
	t.Helper()
	c = health.New(reg, append([]health.Option{health.WithJitter(func(time.Duration) time.Duration { return 0 })}, opts...)...)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var err error
	go func() { err = c.Run(ctx); close(done) }()
	wait = func() error {
		select {
		case <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after cancel")
			return nil
		}
	}
	t.Cleanup(func() {
		cancel()
		if err := wait(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c, cancel, wait
}

func healthOf(reg *registry.Registry, k registry.Key) registry.Health {
	in, _ := reg.Snapshot().Instance(k)
	return in.Health
}

func waitHealth(t *testing.T, reg *registry.Registry, k registry.Key, want registry.Health) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%v to be %s", k, want), func() bool { return healthOf(reg, k) == want })
}

// healthSeen returns the registry health each of the first n arrivals of the phase saw.
func healthSeen(t *testing.T, u *upstream, n int) []registry.Health {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d checks in this phase", n), func() bool { return len(u.inPhase()) >= n })
	var out []registry.Health
	for _, a := range u.inPhase()[:n] {
		out = append(out, a.health)
	}
	return out
}

func repeat(h registry.Health, n int) []registry.Health {
	out := make([]registry.Health, n)
	for i := range out {
		out[i] = h
	}
	return out
}

// TestThresholds: a healthy instance that starts failing turns unhealthy on exactly the
// unhealthy-threshold-th failure, and healthy again on exactly the healthy-threshold-th pass.
// Each check's handler records the registry's health as the check arrived: the first
// threshold checks of a phase see the old verdict, the next one sees the new.
func TestThresholds(t *testing.T) {
	for _, tt := range []struct{ healthy, unhealthy int }{{1, 1}, {2, 3}, {4, 2}} {
		t.Run(fmt.Sprintf("healthy=%d,unhealthy=%d", tt.healthy, tt.unhealthy), func(t *testing.T) {
			reg := registry.New()
			k := registry.Key{Service: "web", ID: "a"}
			u := newUpstream(t, reg, k)
			hc := registry.HealthCheck{Path: "/healthz", Interval: 15 * time.Millisecond, Timeout: 2 * time.Second,
				HealthyThreshold: tt.healthy, UnhealthyThreshold: tt.unhealthy}
			apply(t, reg, service(hc), instance("a", u.port()))
			run(t, reg)

			// Unknown → healthy on the first pass, whatever the healthy threshold.
			if diff := cmp.Diff([]registry.Health{registry.HealthUnknown, registry.HealthHealthy}, healthSeen(t, u, 2)); diff != "" {
				t.Errorf("first checks saw (-want +got):\n%s", diff)
			}

			u.set(fail)
			want := append(repeat(registry.HealthHealthy, tt.unhealthy), registry.HealthUnhealthy)
			if diff := cmp.Diff(want, healthSeen(t, u, tt.unhealthy+1)); diff != "" {
				t.Errorf("failing checks saw (-want +got):\n%s", diff)
			}

			u.set(pass)
			want = append(repeat(registry.HealthUnhealthy, tt.healthy), registry.HealthHealthy)
			if diff := cmp.Diff(want, healthSeen(t, u, tt.healthy+1)); diff != "" {
				t.Errorf("passing checks saw (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTimeoutsFail: a check that gets no answer within the timeout is a failure.
func TestTimeoutsFail(t *testing.T) {
	reg := registry.New()
	k := registry.Key{Service: "web", ID: "a"}
	u := newUpstream(t, reg, k)
	// The timeout leaves passing checks ample time even on a loaded machine (a passing check
	// that timed out would count as a failure and shift the sequence below).
	hc := registry.HealthCheck{Path: "/healthz", Interval: 100 * time.Millisecond, Timeout: time.Second,
		HealthyThreshold: 1, UnhealthyThreshold: 2}
	apply(t, reg, service(hc), instance("a", u.port()))
	run(t, reg)
	waitHealth(t, reg, k, registry.HealthHealthy)

	u.set(hang)
	want := []registry.Health{registry.HealthHealthy, registry.HealthHealthy, registry.HealthUnhealthy}
	if diff := cmp.Diff(want, healthSeen(t, u, 3)); diff != "" {
		t.Errorf("hanging checks saw (-want +got):\n%s", diff)
	}
	u.set(pass)
	waitHealth(t, reg, k, registry.HealthHealthy)
}

func TestConnectionRefusedFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil { // nothing listens on port any more
		t.Fatal(err)
	}

	reg := registry.New()
	hc := registry.HealthCheck{Path: "/healthz", Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond,
		HealthyThreshold: 1, UnhealthyThreshold: 2}
	apply(t, reg, service(hc), instance("a", port))
	run(t, reg)
	waitHealth(t, reg, registry.Key{Service: "web", ID: "a"}, registry.HealthUnhealthy)
}

// TestStatusCodes: only 2xx passes; a redirect is not followed.
func TestStatusCodes(t *testing.T) {
	var followed atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/target", func(w http.ResponseWriter, r *http.Request) { followed.Add(1) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	codes := []struct {
		code int
		want registry.Health
	}{
		{200, registry.HealthHealthy},
		{204, registry.HealthHealthy},
		{299, registry.HealthHealthy},
		{302, registry.HealthUnhealthy},
		{404, registry.HealthUnhealthy},
		{500, registry.HealthUnhealthy},
		{503, registry.HealthUnhealthy},
	}
	var ins []registry.Instance
	servers := map[string]*httptest.Server{}
	for _, c := range codes {
		id := fmt.Sprintf("code-%d", c.code)
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.code == http.StatusFound {
				http.Redirect(w, r, srv.URL+"/target", http.StatusFound)
				return
			}
			w.WriteHeader(c.code)
		}))
		t.Cleanup(s.Close)
		servers[id] = s
		ins = append(ins, instance(id, s.Listener.Addr().(*net.TCPAddr).Port))
	}
	reg := registry.New()
	hc := registry.HealthCheck{Path: "/healthz", Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond,
		HealthyThreshold: 1, UnhealthyThreshold: 1}
	apply(t, reg, service(hc), ins...)
	run(t, reg)
	for _, c := range codes {
		t.Run(fmt.Sprint(c.code), func(t *testing.T) {
			waitHealth(t, reg, registry.Key{Service: "web", ID: fmt.Sprintf("code-%d", c.code)}, c.want)
		})
	}
	if n := followed.Load(); n != 0 {
		t.Errorf("a redirect was followed %d times", n)
	}
}

// TestFollowsRegistry: checks start, move and stop with the registry's generations.
func TestFollowsRegistry(t *testing.T) {
	reg := registry.New()
	k := registry.Key{Service: "web", ID: "a"}
	first, second := newUpstream(t, reg, k), newUpstream(t, reg, k)
	hc := registry.HealthCheck{Path: "/healthz", Interval: 10 * time.Millisecond, Timeout: 500 * time.Millisecond,
		HealthyThreshold: 1, UnhealthyThreshold: 1}
	apply(t, reg, service(hc))
	c, _, _ := run(t, reg)

	// An instance added to the registry gets checked.
	apply(t, reg, service(hc), instance("a", first.port()))
	waitHealth(t, reg, k, registry.HealthHealthy)
	if diff := cmp.Diff([]registry.Key{k}, c.Probing()); diff != "" {
		t.Errorf("Probing (-want +got):\n%s", diff)
	}

	// A changed port moves the checks; the old prober has stopped before the new one starts.
	apply(t, reg, service(hc), instance("a", second.port()))
	// (Counting starts a few checks later so that a check cancelled mid-flight by the move,
	// which the old server may still log, is not mistaken for a late one.)
	testutil.Eventually(t, "checks on the new port", func() bool { return second.count() > 2 })
	before := first.count()
	testutil.Eventually(t, "more checks on the new port", func() bool { return second.count() > 8 })
	if n := first.count(); n != before {
		t.Errorf("old port got %d checks after the move", n-before)
	}
	if got := healthOf(reg, k); got != registry.HealthHealthy {
		t.Errorf("health after the move = %s, want healthy (kept)", got)
	}

	// Turning checks off stops them and forgets the verdict.
	apply(t, reg, service(registry.HealthCheck{Path: "/healthz"}), instance("a", second.port()))
	waitHealth(t, reg, k, registry.HealthUnknown)
	testutil.Eventually(t, "no probers", func() bool { return len(c.Probing()) == 0 })

	// On again, then the instance is removed: checks stop.
	apply(t, reg, service(hc), instance("a", second.port()))
	waitHealth(t, reg, k, registry.HealthHealthy)
	apply(t, reg, service(hc))
	testutil.Eventually(t, "no probers", func() bool { return len(c.Probing()) == 0 })
	time.Sleep(2 * hc.Interval) // let a check cancelled by the removal reach the server's log
	stopped := second.count()
	time.Sleep(10 * hc.Interval)
	if n := second.count(); n != stopped {
		t.Errorf("removed instance got %d checks after removal", n-stopped)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	reg := registry.New()
	k := registry.Key{Service: "web", ID: "a"}
	u := newUpstream(t, reg, k)
	u.set(hang) // a check is in flight when Run is cancelled
	hc := registry.HealthCheck{Path: "/healthz", Interval: 10 * time.Millisecond, Timeout: time.Minute,
		HealthyThreshold: 1, UnhealthyThreshold: 1}
	apply(t, reg, service(hc), instance("a", u.port()))
	c, cancel, wait := run(t, reg)
	testutil.Eventually(t, "a check in flight", func() bool { return u.count() > 0 })
	cancel()
	if err := wait(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	if p := c.Probing(); len(p) != 0 {
		t.Errorf("Probing after Run = %v, want none", p)
	}
	if got := healthOf(reg, k); got != registry.HealthUnknown {
		t.Errorf("a cancelled check gave a verdict: %s", got)
	}
}

func TestFirstCheckIsJittered(t *testing.T) {
	reg := registry.New()
	var mu sync.Mutex
	var got []time.Duration
	jitter := func(d time.Duration) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d)
		return d / 2
	}
	hc := registry.HealthCheck{Path: "/healthz", Interval: 40 * time.Millisecond, Timeout: 10 * time.Millisecond,
		HealthyThreshold: 1, UnhealthyThreshold: 1}
	var ins []registry.Instance
	for i := range 3 {
		u := newUpstream(t, reg, registry.Key{Service: "web", ID: fmt.Sprint(i)})
		ins = append(ins, instance(fmt.Sprint(i), u.port()))
	}
	apply(t, reg, service(hc), ins...)
	run(t, reg, health.WithJitter(jitter))
	for _, in := range ins {
		waitHealth(t, reg, in.Key(), registry.HealthHealthy)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(repeat40ms(3), got); diff != "" {
		t.Errorf("jitter called with (-want +got):\n%s", diff)
	}
}

func repeat40ms(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = 40 * time.Millisecond
	}
	return out
}
