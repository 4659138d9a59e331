package replicatest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/api"
	tfleet "github.com/tether-dev/tether/pkg/fleet"
	"github.com/tether-dev/tether/pkg/health"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// sharedReplica adds to a replica what serve adds with the redis backend: the registry's admin
// layer shared through Redis (pkg/fleet), the health checker elected with a lease, and the
// admin API (with /v1/status) on loopback.
type sharedReplica struct {
	*replicatest.Replica
	fleet   *tfleet.Registry
	checker *health.Checker
	api     string // the admin API's base URL

	cancel context.CancelFunc
	done   sync.WaitGroup
	once   sync.Once
}

// storeLease is the health lease in the replica's store, as serve uses it.
type storeLease struct{ r *replicatest.Replica }

func (l storeLease) Hold(ctx context.Context, ttl time.Duration) (bool, error) {
	return l.r.Store.HoldLease(ctx, "health", ttl)
}

func (l storeLease) Release(ctx context.Context) error { return l.r.Store.ReleaseLease(ctx, "health") }

// probeHeader names the replica that sent a health check, so the upstream can count them.
const probeHeader = "X-Probe-Replica"

type taggedTransport struct {
	name string
	rt   http.RoundTripper
}

func (tt taggedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(probeHeader, tt.name)
	return tt.rt.RoundTrip(r)
}

func share(t *testing.T, r *replicatest.Replica, leaseTTL time.Duration) *sharedReplica {
	t.Helper()
	f, err := tfleet.New(r.Store.Client(), r.Store.KeyPrefix(), r.Registry, tfleet.WithResync(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := &sharedReplica{Replica: r, fleet: f}
	s.checker = health.New(r.Registry,
		health.WithLease(storeLease{r}, leaseTTL),
		health.WithTransport(taggedTransport{r.Name, &http.Transport{Proxy: nil}}))
	srv := &http.Server{
		Handler: api.NewServer(r.Registry, api.WithEngine(r.Engine),
			api.WithStatus(status.New(r.Registry, r.Engine).Snapshot, 0)).Handler(),
		ReadHeaderTimeout: 5 * time.Second,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.api = "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done.Go(func() { _ = f.Run(ctx) })
	s.done.Go(func() { _ = s.checker.Run(ctx) })
	s.done.Go(func() { _ = srv.Serve(ln) })
	s.done.Go(func() { <-ctx.Done(); _ = srv.Close() })
	t.Cleanup(s.stop)
	select {
	case <-f.Subscribed():
	case <-time.After(10 * time.Second):
		t.Fatalf("replica %s: the shared registry did not subscribe", r.Name)
	}
	return s
}

func (s *sharedReplica) stop() {
	s.once.Do(func() { s.cancel(); s.done.Wait() })
}

// crash ends the replica as kill -9 would: its connections are cut first, nothing is handed over
// (its health lease stays until it expires).
func (s *sharedReplica) crash() {
	s.Crash()
	s.stop()
}

func shareAll(t *testing.T, reps []*replicatest.Replica, leaseTTL time.Duration) []*sharedReplica {
	out := make([]*sharedReplica, len(reps))
	for i, r := range reps {
		out[i] = share(t, r, leaseTTL)
	}
	return out
}

func (s *sharedReplica) instance(service, id string) (registry.Instance, bool) {
	return s.Registry.Snapshot().Instance(registry.Key{Service: service, ID: id})
}

// watchEDS follows a replica's xDS as Envoy does and returns its endpoint view.
func watchEDS(t *testing.T, r *replicatest.Replica) *envoyharness.XDSEndpoints {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	x, err := envoyharness.WatchXDS(ctx, r.XDSAddr, xds.DefaultNodeID)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close(); cancel() })
	return x
}

func waitEDS(t *testing.T, x *envoyharness.XDSEndpoints, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := x.Wait(ctx, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// sameSnapshots fails unless every replica publishes the same instances of service.
func sameSnapshots(t *testing.T, reps []*sharedReplica, service string) {
	t.Helper()
	want := reps[0].Registry.Snapshot().Instances(service)
	for _, r := range reps[1:] {
		if got := r.Registry.Snapshot().Instances(service); !slices.Equal(got, want) {
			t.Errorf("replica %s publishes %+v, replica %s %+v", r.Name, got, reps[0].Name, want)
		}
	}
}

// newSession makes a new cookie session through replica i and returns the instance it landed on
// and its cookie ("" instance for a refusal, with the status).
func (f *fleet) newSession(t *testing.T, i int, path string) (instance, cookie string, code int) {
	t.Helper()
	resp := f.do(t, i, "GET", path)
	if resp.StatusCode != http.StatusOK {
		return "", "", resp.StatusCode
	}
	return resp.Header.Get("X-Upstream-Instance"), strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0], resp.StatusCode
}

// TestSharedRegistrationDrainAndHealth: an instance registered through replica a's admin API
// is served in b's and c's EDS and gets their new sessions; drained through b, a and c place
// no new session on it while its sessions keep it; set unhealthy on c, it leaves every
// replica's EDS; a config reload on all three keeps all of it; deregistered through c, it is
// gone everywhere. After each step every replica publishes the same instances.
func TestSharedRegistrationDrainAndHealth(t *testing.T) {
	svc := service("ck", registry.AffinityCookie)
	svc.SessionsPerInstance = 3 // new sessions fill the fullest instance with room: ck-i1..i3 first
	f := startFleet(t, []registry.Service{svc})
	reps := shareAll(t, f.replicas, 0)
	eds := make([]*envoyharness.XDSEndpoints, len(reps))
	for i, r := range f.replicas {
		eds[i] = watchEDS(t, r)
	}
	extra := startApp(t, "ck-i4")
	in := extra.instance("ck")
	k := in.Key()

	// Register through a's admin API.
	body := fmt.Sprintf(`{"id":%q,"address":%q,"httpPort":%d}`, in.ID, in.Address, in.HTTPPort)
	if resp := testutil.Do(t, "POST", reps[0].api+"/v1/services/ck/instances", body, wire.ClientHeader, "test", "Content-Type", "application/json"); resp.Status != http.StatusCreated {
		t.Fatalf("register through a: %d %s", resp.Status, resp.Body)
	}
	for i, x := range eds {
		waitEDS(t, x, fmt.Sprintf("replica %s serves the registration in EDS", reps[i].Name), func() bool {
			return slices.Contains(x.Addresses("ck"), extra.addr)
		})
	}
	sameSnapshots(t, reps, "ck")
	// Fill the config instances through a (9 sessions); then b and c place their new sessions
	// on the registered instance.
	for n := range 9 {
		if got, _, code := f.newSession(t, 0, "/ck/page"); got == "" || got == in.ID {
			t.Fatalf("filling session %d through a: %d on %q, want a config instance", n, code, got)
		}
	}
	var onExtra []string
	for i := 1; i <= 2; i++ {
		got, c, code := f.newSession(t, i, "/ck/page")
		if got != in.ID {
			t.Fatalf("new session through replica %s: %d on %q, want the registered %s", reps[i].Name, code, got, in.ID)
		}
		onExtra = append(onExtra, c)
	}
	for i := range 10 {
		if got := f.do(t, 2, "GET", "/ck/page", "Cookie", onExtra[0]).Header.Get("X-Upstream-Instance"); got != in.ID {
			t.Fatalf("request %d of b's session through c went to %q, want %s", i, got, in.ID)
		}
	}

	// Drain through b's admin API. It has a free session slot, the others none: new sessions
	// through a and c are refused rather than placed on it; its sessions keep it.
	if resp := testutil.Do(t, "PUT", reps[1].api+"/v1/services/ck/instances/ck-i4/state", `{"state":"INSTANCE_STATE_DRAINING"}`,
		wire.ClientHeader, "test", "Content-Type", "application/json"); resp.Status != http.StatusOK {
		t.Fatalf("drain through b: %d %s", resp.Status, resp.Body)
	}
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+" sees the drain", func() bool {
			got, _ := r.instance("ck", in.ID)
			return got.State == registry.StateDraining
		})
	}
	sameSnapshots(t, reps, "ck")
	for _, u := range mustUsage(t, reps[0].Engine, "ck") {
		if u.Instance.ID == in.ID && u.Sessions != 2 {
			t.Fatalf("the registered instance holds %d sessions, want 2 (one free slot)", u.Sessions)
		}
	}
	for _, i := range []int{0, 2} {
		for n := range 5 {
			if got, _, code := f.newSession(t, i, "/ck/page"); code != http.StatusServiceUnavailable {
				t.Fatalf("new session %d through replica %s after the drain: %d on %q, want 503 (only the draining instance has room)",
					n, reps[i].Name, code, got)
			}
		}
		for _, c := range onExtra {
			if got := f.do(t, i, "GET", "/ck/page", "Cookie", c).Header.Get("X-Upstream-Instance"); got != in.ID {
				t.Fatalf("an existing session through replica %s went to %q after the drain, want %s", reps[i].Name, got, in.ID)
			}
		}
	}

	// Unhealthy on c (the verdict SetHealth records, as the health checker does).
	if _, err := reps[2].Registry.SetHealth(k, registry.HealthUnhealthy); err != nil {
		t.Fatal(err)
	}
	for i, x := range eds {
		waitEDS(t, x, fmt.Sprintf("replica %s drops the unhealthy instance from EDS", reps[i].Name), func() bool {
			return !slices.Contains(x.Addresses("ck"), extra.addr)
		})
	}
	sameSnapshots(t, reps, "ck")

	// A config reload on every replica (one config instance dropped) keeps the shared layer.
	var cfg []registry.Instance
	for _, id := range []string{"ck-i1", "ck-i2"} {
		cfg = append(cfg, f.apps[id].instance("ck"))
	}
	for _, r := range reps {
		if err := r.Registry.Apply([]registry.Service{svc}, cfg); err != nil {
			t.Fatal(err)
		}
		got, ok := r.instance("ck", in.ID)
		if !ok || got.State != registry.StateDraining || got.Health != registry.HealthUnhealthy {
			t.Fatalf("replica %s after a reload: %+v (present %v), want the registration draining and unhealthy", r.Name, got, ok)
		}
		if _, ok := r.instance("ck", "ck-i3"); ok {
			t.Fatalf("replica %s still has the instance the reload dropped", r.Name)
		}
	}
	sameSnapshots(t, reps, "ck")
	// Healthy again through a: every EDS serves it again.
	if _, err := reps[0].Registry.SetHealth(k, registry.HealthHealthy); err != nil {
		t.Fatal(err)
	}
	for i, x := range eds {
		waitEDS(t, x, fmt.Sprintf("replica %s serves the healthy instance again", reps[i].Name), func() bool {
			return slices.Contains(x.Addresses("ck"), extra.addr) && !slices.Contains(x.Addresses("ck"), f.apps["ck-i3"].addr)
		})
	}

	// Deregister through c.
	if resp := testutil.Do(t, "DELETE", reps[2].api+"/v1/services/ck/instances/ck-i4", "", wire.ClientHeader, "test"); resp.Status != http.StatusOK {
		t.Fatalf("deregister through c: %d %s", resp.Status, resp.Body)
	}
	for i, x := range eds {
		waitEDS(t, x, fmt.Sprintf("replica %s drops the deregistered instance", reps[i].Name), func() bool {
			return !slices.Contains(x.Addresses("ck"), extra.addr)
		})
	}
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+" forgets the registration", func() bool { _, ok := r.instance("ck", in.ID); return !ok })
	}
	sameSnapshots(t, reps, "ck")
}

// probed is an upstream that counts the health checks it gets per replica and fails them
// while failing is set.
type probed struct {
	id, addr string
	failing  atomic.Bool
	mu       sync.Mutex
	by       map[string]int // replica → checks
}

func startProbed(t *testing.T, id string) *probed {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &probed{id: id, addr: ln.Addr().String(), by: map[string]int{}}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			p.mu.Lock()
			p.by[r.Header.Get(probeHeader)]++
			p.mu.Unlock()
			if p.failing.Load() {
				http.Error(w, "failing", http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return p
}

func (p *probed) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.by))
	for k, v := range p.by {
		out[k] = v
	}
	return out
}

func (p *probed) instance(service string) registry.Instance {
	host, port, _ := net.SplitHostPort(p.addr)
	var n int
	_, _ = fmt.Sscan(port, &n)
	return registry.Instance{Service: service, ID: p.id, Address: host, HTTPPort: n, Weight: 1, State: registry.StateActive}
}

// leaders samples which checkers lead until the test ends and remembers the most seen at once.
func leaders(t *testing.T, reps []*sharedReplica) *atomic.Int64 {
	var most atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			n := int64(0)
			for _, r := range reps {
				if r.checker.Leading() {
					n++
				}
			}
			if n > most.Load() {
				most.Store(n)
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &most
}

func leader(reps []*sharedReplica) *sharedReplica {
	for _, r := range reps {
		if r.checker.Leading() {
			return r
		}
	}
	return nil
}

// TestOneHealthCheckerAcrossReplicas: of three replicas only the lease holder probes the
// instances (counted at the upstreams), its verdicts reach all three; when it is killed
// another replica takes over within the lease TTL plus its retry period and one interval, and
// when that one stops gracefully it hands the lease to the last one at once.
func TestOneHealthCheckerAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	const interval, ttl = 100 * time.Millisecond, 3 * time.Second
	svc := service("hc", registry.AffinityCookie)
	svc.HealthCheck = registry.HealthCheck{Path: "/healthz", Interval: interval, Timeout: time.Second, HealthyThreshold: 1, UnhealthyThreshold: 1}
	p1, p2 := startProbed(t, "hc-p1"), startProbed(t, "hc-p2")
	reps := shareAll(t, replicatest.Start(t, srv.Addr, 3, []registry.Service{svc},
		[]registry.Instance{p1.instance("hc"), p2.instance("hc")}, replicatest.Options{}), ttl)
	most := leaders(t, reps)

	testutil.Eventually(t, "every replica sees both instances healthy", func() bool {
		for _, r := range reps {
			for _, p := range []*probed{p1, p2} {
				if in, _ := r.instance("hc", p.id); in.Health != registry.HealthHealthy {
					return false
				}
			}
		}
		return true
	})
	testutil.Eventually(t, "20 checks of each instance", func() bool {
		return total(p1.counts()) >= 20 && total(p2.counts()) >= 20
	})
	lead := leader(reps)
	if lead == nil {
		t.Fatal("no checker leads")
	}
	for _, p := range []*probed{p1, p2} {
		if c := p.counts(); len(c) != 1 || c[lead.Name] == 0 {
			t.Fatalf("checks of %s by replica: %v, want all by the lease holder %s", p.id, c, lead.Name)
		}
	}

	// The holder's verdict reaches every replica.
	p2.failing.Store(true)
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+" sees p2 unhealthy", func() bool {
			in, _ := r.instance("hc", p2.id)
			return in.Health == registry.HealthUnhealthy
		})
	}
	p2.failing.Store(false)

	// Kill the holder: another replica probes within TTL + TTL/10 (its retry period) + interval.
	before := p1.counts()
	killed := time.Now()
	lead.crash()
	var rest []*sharedReplica
	for _, r := range reps {
		if r != lead {
			rest = append(rest, r)
		}
	}
	bound := ttl + ttl/10 + interval
	testutil.EventuallyWithin(t, bound+2*time.Second, "another replica checks p1", func() bool {
		c := p1.counts()
		for _, r := range rest {
			if c[r.Name] > before[r.Name] {
				return true
			}
		}
		return false
	})
	took := time.Since(killed)
	t.Logf("takeover: %v after the kill (lease TTL %v, bound TTL+TTL/10+interval = %v)", took.Round(time.Millisecond), ttl, bound)
	if took > bound+time.Second {
		t.Errorf("takeover took %v, want ≤ %v (+1 s of slack on a loaded machine)", took, bound)
	}
	after := p1.counts()[lead.Name]
	// The new holder's verdicts reach the survivors.
	p1.failing.Store(true)
	for _, r := range rest {
		testutil.Eventually(t, "replica "+r.Name+" sees p1 unhealthy from the new holder", func() bool {
			in, _ := r.instance("hc", p1.id)
			return in.Health == registry.HealthUnhealthy
		})
	}
	if n := p1.counts()[lead.Name]; n != after {
		t.Errorf("the killed replica checked %d more times", n-after)
	}

	// Stop the new holder gracefully: it hands the lease over, so the last replica checks
	// within TTL/10 + interval, long before the lease would have lapsed.
	next := leader(rest)
	if next == nil {
		t.Fatal("no surviving checker leads")
	}
	last := rest[0]
	if last == next {
		last = rest[1]
	}
	before = p1.counts()
	stopped := time.Now()
	next.stop()
	testutil.EventuallyWithin(t, ttl, "the last replica checks p1 after a graceful stop", func() bool {
		return p1.counts()[last.Name] > before[last.Name]
	})
	t.Logf("handover after a graceful stop: %v", time.Since(stopped).Round(time.Millisecond))
	if n := most.Load(); n != 1 {
		t.Errorf("at most %d checkers led at once, want 1", n)
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// statusSources is what the test reads of /v1/status.
type statusSources struct {
	Sources []struct {
		Name, Kind, LastError string
		Failing, Synced       bool
		Instances             int
	} `json:"sources"`
}

func apiSourceStatus(t *testing.T, base string) (kind string, failing bool, lastError string) {
	t.Helper()
	resp, err := testutil.Try("GET", base+"/v1/status", "")
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("GET /v1/status: %v %d %s", err, resp.Status, resp.Body)
	}
	var st statusSources
	if err := json.Unmarshal([]byte(resp.Body), &st); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Sources {
		if s.Name == registry.LayerAPI {
			return s.Kind, s.Failing, s.LastError
		}
	}
	t.Fatalf("/v1/status has no api source: %s", resp.Body)
	return "", false, ""
}

// TestSharedRegistryRedisUnreachable: with Redis gone each replica keeps the last shared layer
// and says so in /v1/status; admin changes answer 503 and change nothing; health checks go on,
// each replica on its own; when Redis is back the status heals, one checker is elected again
// and changes reach every replica again.
func TestSharedRegistryRedisUnreachable(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF("always"))
	svc := service("ru", registry.AffinityCookie)
	svc.HealthCheck = registry.HealthCheck{Path: "/healthz", Interval: 50 * time.Millisecond, Timeout: time.Second, HealthyThreshold: 1, UnhealthyThreshold: 1}
	p := startProbed(t, "ru-p1")
	reps := shareAll(t, replicatest.Start(t, srv.Addr, 2, []registry.Service{svc}, []registry.Instance{p.instance("ru")}, replicatest.Options{}), time.Second)
	a, b := reps[0], reps[1]
	register := func(r *sharedReplica, id string) testutil.Response {
		resp, err := testutil.Try("POST", r.api+"/v1/services/ru/instances", fmt.Sprintf(`{"id":%q,"address":"127.0.0.1","httpPort":9}`, id),
			wire.ClientHeader, "test", "Content-Type", "application/json")
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := register(a, "ru-r1"); resp.Status != http.StatusCreated {
		t.Fatalf("register: %d %s", resp.Status, resp.Body)
	}
	testutil.Eventually(t, "b sees the registration", func() bool { _, ok := b.instance("ru", "ru-r1"); return ok })
	if kind, failing, _ := apiSourceStatus(t, b.api); kind != "redis" || failing {
		t.Fatalf("b's api source: kind %q failing %v, want redis, not failing", kind, failing)
	}

	srv.Kill()
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+"'s status says the shared layer is failing", func() bool {
			_, failing, lastErr := apiSourceStatus(t, r.api)
			return failing && lastErr != ""
		})
		if _, ok := r.instance("ru", "ru-r1"); !ok {
			t.Fatalf("replica %s lost the last known registration with Redis down", r.Name)
		}
	}
	if resp := register(b, "ru-r2"); resp.Status != http.StatusServiceUnavailable {
		t.Errorf("register with Redis down: %d %s, want 503", resp.Status, resp.Body)
	}
	if _, ok := b.instance("ru", "ru-r2"); ok {
		t.Error("a registration that failed is served")
	}
	// No lease can be had: after a TTL each replica checks on its own, and an instance that
	// fails now is unhealthy on both (their own verdicts).
	before := p.counts()
	p.failing.Store(true)
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+" checks on its own and sees p unhealthy", func() bool {
			in, _ := r.instance("ru", p.id)
			return r.checker.Local() && p.counts()[r.Name] > before[r.Name] && in.Health == registry.HealthUnhealthy
		})
	}

	srv.Restart()
	for _, r := range reps {
		testutil.EventuallyWithin(t, 20*time.Second, "replica "+r.Name+"'s status heals", func() bool {
			_, failing, _ := apiSourceStatus(t, r.api)
			return !failing
		})
	}
	// One checker again, its verdict shared: p stays unhealthy everywhere, then heals everywhere.
	testutil.Eventually(t, "one elected checker, none on its own", func() bool {
		n := 0
		for _, r := range reps {
			if r.checker.Local() {
				return false
			}
			if r.checker.Leading() {
				n++
			}
		}
		return n == 1
	})
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+" has the shared unhealthy verdict", func() bool {
			in, _ := r.instance("ru", p.id)
			return in.Health == registry.HealthUnhealthy
		})
	}
	p.failing.Store(false)
	for _, r := range reps {
		testutil.Eventually(t, "replica "+r.Name+" sees p healthy again", func() bool {
			in, _ := r.instance("ru", p.id)
			return in.Health == registry.HealthHealthy
		})
	}
	// A connection the restart cut may fail one more call; then changes flow again.
	testutil.Eventually(t, "a registration through b succeeds again", func() bool {
		resp := register(b, "ru-r2")
		return resp.Status == http.StatusCreated || resp.Status == http.StatusConflict
	})
	testutil.Eventually(t, "a sees it", func() bool { _, ok := a.instance("ru", "ru-r2"); return ok })
	if _, ok := a.instance("ru", "ru-r1"); !ok {
		t.Error("the registration made before the outage is gone (Redis replayed its AOF)")
	}
}
