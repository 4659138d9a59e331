package fleet_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/fleet"
	"github.com/tether-dev/tether/pkg/registry"
)

var svc = registry.Service{Name: "web", Affinity: registry.AffinityCookie, SessionsPerInstance: 10,
	RequestSlotsPerInstance: 10, SessionTTL: time.Hour}

func cfgInstance(id string) registry.Instance {
	return registry.Instance{Service: "web", ID: id, Address: "127.0.0.1", HTTPPort: 8000, State: registry.StateActive}
}

type replica struct {
	reg   *registry.Registry
	fleet *fleet.Registry
	c     rueidis.Client
	stop  func()
}

// start runs one replica's registry and shared layer on the Redis at addr under prefix.
func start(t *testing.T, addr, prefix string, opts ...fleet.Option) *replica {
	t.Helper()
	return startOn(t, []string{addr}, prefix, opts...)
}

// startOn is start on several addresses (the seeds of a Cluster).
func startOn(t *testing.T, addrs []string, prefix string, opts ...fleet.Option) *replica {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true,
		Dialer: netDialer(), ConnWriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New()
	if err := reg.Apply([]registry.Service{svc}, []registry.Instance{cfgInstance("c1")}); err != nil {
		t.Fatal(err)
	}
	f, err := fleet.New(c, prefix, reg, append([]fleet.Option{fleet.WithResync(100 * time.Millisecond),
		fleet.WithOpTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.Run(ctx) })
	r := &replica{reg: reg, fleet: f, c: c}
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); wg.Wait(); c.Close() }) }
	t.Cleanup(r.stop)
	select {
	case <-f.Subscribed():
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription")
	}
	return r
}

func inst(r *replica, id string) (registry.Instance, bool) {
	return r.reg.Snapshot().Instance(registry.Key{Service: "web", ID: id})
}

func apiSource(r *replica) registry.SourceStatus {
	for _, s := range r.reg.Sources() {
		if s.Name == registry.LayerAPI {
			return s
		}
	}
	return registry.SourceStatus{}
}

// TestSharedAdminLayer: registrations, states and health verdicts made through one registry
// reach the other; conflicts are refused or resolved by the last writer; the layer survives a
// config reload and is there for a registry that starts later.
func TestSharedAdminLayer(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Start(t)
	// No periodic check within the test: every change travels by its message.
	a, b := start(t, srv.Addr, "t1:", fleet.WithResync(time.Hour)), start(t, srv.Addr, "t1:", fleet.WithResync(time.Hour))
	k := registry.Key{Service: "web", ID: "r1"}

	if err := a.reg.Register(registry.Instance{Service: "web", ID: "r1", Address: "127.0.0.2", HTTPPort: 9000, Zone: "z1"}); err != nil {
		t.Fatal(err)
	}
	if in, ok := inst(a, "r1"); !ok || in.Address != "127.0.0.2" {
		t.Fatalf("the registering replica does not serve its registration at once: %+v %v", in, ok)
	}
	testutil.Eventually(t, "b sees a's registration", func() bool {
		in, ok := inst(b, "r1")
		return ok && in.HTTPPort == 9000 && in.Zone == "z1" && in.Weight == 1 && in.State == registry.StateActive
	})
	if s := apiSource(b); s.Kind != "redis" || s.Instances != 1 || !s.Synced || s.Failing {
		t.Errorf("b's api source = %+v, want kind redis, 1 instance, synced", s)
	}

	// Same key again, through the other replica, before and after it has seen it.
	if err := b.reg.Register(registry.Instance{Service: "web", ID: "r1", Address: "127.0.0.3", HTTPPort: 9000}); !errors.Is(err, registry.ErrExists) {
		t.Errorf("second registration of r1: %v, want ErrExists", err)
	}

	// Drain on b (an admin registration), standby on a (a config instance).
	if err := b.reg.SetState(k, registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	if err := a.reg.SetState(registry.Key{Service: "web", ID: "c1"}, registry.StateStandby); err != nil {
		t.Fatal(err)
	}
	if _, err := b.reg.SetHealth(registry.Key{Service: "web", ID: "c1"}, registry.HealthUnhealthy); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*replica{a, b} {
		testutil.Eventually(t, "states and health everywhere", func() bool {
			r1, _ := inst(r, "r1")
			c1, _ := inst(r, "c1")
			return r1.State == registry.StateDraining && c1.State == registry.StateStandby && c1.Health == registry.HealthUnhealthy
		})
	}

	// Last writer wins: a activates r1 after b drained it.
	if err := a.reg.SetState(k, registry.StateActive); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b follows the last writer", func() bool {
		r1, _ := inst(b, "r1")
		return r1.State == registry.StateActive
	})

	// A config reload keeps the shared layer (and a drop of c1 from the config drops it, while
	// its facts wait in the shared layer for it to come back).
	if err := b.reg.Apply([]registry.Service{svc}, []registry.Instance{cfgInstance("c2")}); err != nil {
		t.Fatal(err)
	}
	if _, ok := inst(b, "r1"); !ok {
		t.Fatal("the registration vanished on a config reload")
	}
	if err := b.reg.Apply([]registry.Service{svc}, []registry.Instance{cfgInstance("c1")}); err != nil {
		t.Fatal(err)
	}
	if c1, _ := inst(b, "c1"); c1.State != registry.StateStandby || c1.Health != registry.HealthUnhealthy {
		t.Errorf("c1 back in the config = %+v, want its shared standby and unhealthy", c1)
	}

	// Deregistering a config instance is every replica's own config: refused.
	if err := a.reg.Deregister(registry.Key{Service: "web", ID: "c1"}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("deregistering a config-file instance: %v, want ErrInvalid", err)
	}

	// A replica that starts now serves the layer from its first snapshot.
	c := start(t, srv.Addr, "t1:", fleet.WithResync(time.Hour))
	if _, ok := inst(c, "r1"); !ok {
		t.Error("a new replica does not serve the registration after Load")
	}
	if c1, _ := inst(c, "c1"); c1.State != registry.StateStandby {
		t.Errorf("a new replica's c1 = %+v, want standby", c1)
	}
	if ea, va := a.fleet.Version(); ea == "" || va == 0 {
		t.Errorf("version = %q %d", ea, va)
	}

	if err := c.reg.Deregister(k); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*replica{a, b, c} {
		testutil.Eventually(t, "deregistration everywhere", func() bool { _, ok := inst(r, "r1"); return !ok })
	}
	if err := a.reg.Deregister(k); !errors.Is(err, registry.ErrUnknownInstance) {
		t.Errorf("deregistering twice: %v, want ErrUnknownInstance", err)
	}

	// Snapshots are identical across replicas for the same layer.
	for _, r := range []*replica{b, c} {
		if got, want := r.reg.Snapshot().Instances("web"), a.reg.Snapshot().Instances("web"); !equalInstances(got, want) {
			t.Errorf("snapshots differ:\n%+v\n%+v", got, want)
		}
	}
}

func equalInstances(a, b []registry.Instance) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMissedMessageHeals: a change whose message a replica never got (written straight into
// Redis, as if published while it was not subscribed) arrives with the periodic check.
func TestMissedMessageHeals(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Start(t)
	a := start(t, srv.Addr, "t2:")
	if _, err := srv.Do("HSET", "t2:{registry}:admin", "i\x1fweb\x1fr9", `{"address":"127.0.0.9","httpPort":9}`); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("INCR", "t2:{registry}:ver"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the periodic check reads the unannounced change", func() bool { _, ok := inst(a, "r9"); return ok })

	// Redis loses its data: a new epoch, and the replica takes the (empty) layer as it is.
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a new epoch replaces the layer", func() bool { _, ok := inst(a, "r9"); return !ok })
}

// TestRedisUnreachableKeepsTheLayer: with Redis gone the replica keeps the last layer and its
// status says failing; admin changes fail with ErrUnavailable; when Redis is back the layer is
// read again and the status heals.
func TestRedisUnreachableKeepsTheLayer(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Start(t, redistest.WithAOF("always"))
	a := start(t, srv.Addr, "t3:")
	if err := a.reg.Register(registry.Instance{Service: "web", ID: "r1", Address: "127.0.0.2", HTTPPort: 9000}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	testutil.Eventually(t, "status says failing", func() bool { s := apiSource(a); return s.Failing && s.LastError != "" })
	if a.fleet.Up() {
		t.Error("Up with Redis down")
	}
	if _, ok := inst(a, "r1"); !ok {
		t.Fatal("the last known registration is gone while Redis is down")
	}
	if err := a.reg.SetState(registry.Key{Service: "web", ID: "r1"}, registry.StateDraining); !errors.Is(err, registry.ErrUnavailable) {
		t.Errorf("SetState with Redis down: %v, want ErrUnavailable", err)
	}
	if in, _ := inst(a, "r1"); in.State != registry.StateActive {
		t.Errorf("a failed change was applied: %+v", in)
	}
	srv.Restart()
	testutil.EventuallyWithin(t, 20*time.Second, "status heals", func() bool { s := apiSource(a); return !s.Failing && a.fleet.Up() })
	// A connection cut by the restart may fail one more call; changes work again by themselves.
	testutil.Eventually(t, "changes work again", func() bool {
		return a.reg.SetState(registry.Key{Service: "web", ID: "r1"}, registry.StateDraining) == nil
	})
	// A resync that read the layer just before the write may apply it just after: the layer
	// converges on the write (seen once under -race in a full run).
	testutil.Eventually(t, "r1 draining after recovery", func() bool {
		in, _ := inst(a, "r1")
		return in.State == registry.StateDraining
	})
}

// TestSharedAdminLayerOnCluster: on a three-node Redis Cluster the layer's keys share one slot
// (the {registry} hash tag) and change messages reach the other replica.
func TestSharedAdminLayerOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	a := startOn(t, cl.Addrs(), "tc:", fleet.WithResync(time.Hour))
	b := startOn(t, cl.Addrs(), "tc:", fleet.WithResync(time.Hour))
	if err := a.reg.Register(registry.Instance{Service: "web", ID: "r1", Address: "127.0.0.2", HTTPPort: 9000}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b hears of the registration", func() bool { _, ok := inst(b, "r1"); return ok })
	if err := b.reg.SetState(registry.Key{Service: "web", ID: "r1"}, registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a hears of the drain", func() bool { in, _ := inst(a, "r1"); return in.State == registry.StateDraining })
}
