// Package replicatest runs several tether replicas in one test process, the way a fleet runs
// them: each replica has its own registry, redisstore.Store handle, quota leases and engine
// with shared slots (affinity.WithSharedSlots), all on one real redis-server
// (internal/redistest). Replicas can be given their own ext_proc and xDS servers and an
// Envoy-faithful harness data plane (Serve).
//
// For faults that need a real process boundary (kill -9), StartProcs runs replicas as tether
// processes (cmd/tether built once per test run, BuildTether) with generated configs on
// ephemeral ports, and Proc.Serve puts a harness data plane in front of each.
package replicatest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// Replica is one tether replica.
type Replica struct {
	Name     string
	Registry *registry.Registry
	Store    *redisstore.Store
	Leases   *quota.Leases
	Engine   *affinity.Engine

	ExtProcAddr, XDSAddr string
	Harness              *envoyharness.Harness

	cancel context.CancelFunc
	done   sync.WaitGroup
	once   sync.Once
}

// Options tune the replicas.
type Options struct {
	// LeaseTTL is the quota lease TTL (default 2 s, short so that tests see expiry).
	LeaseTTL time.Duration
	// DegradedFor is the quota's fail-static window (default: LeaseTTL, so that the hold is
	// the lease TTL).
	DegradedFor time.Duration
	// Addr, when set, gives each replica (by name: "a", "b", …) its own address of the Redis
	// (a fault proxy in front of it, so that one replica can be cut off alone).
	Addr func(name string) string
	// Clock, when set, gives each replica (by name) its wall clock — its engine's, its session
	// store handle's and its leases' (a shifted one, to show that neither sessions nor leases
	// depend on it: Redis's clock decides).
	Clock func(name string) func() time.Time
	// OpTimeout bounds each session-store call and each lease call on a request's path
	// (default: the harness's ext_proc message timeout for the store, a quarter of it for the
	// leases — generous for a loaded machine).
	OpTimeout time.Duration
	// Unseeded leaves the fresh Redis unmarked: the first epoch of each service's leases then
	// has its learning window (one hold without new grants), as on a real first start.
	Unseeded bool
	// TouchDelay is the store's touch batching (default 100 ms).
	TouchDelay time.Duration
	// Engine adds engine options.
	Engine []affinity.Option
	// Durability is what the stores' acknowledged writes wait for (store.redis.ackDurability;
	// default none).
	Durability redisstore.Durability
	// MasterSet, when set, makes addr a Sentinel's address watching this master set.
	MasterSet string
	// Seeds, when set, are the addresses the stores connect to instead of addr (a Cluster's
	// nodes: any one that answers tells the client the rest).
	Seeds []string
	// Defaults runs the store, the leases and the engine on tether serve's default intervals
	// (touch batching, reaping, lease TTL, sweeping) instead of the short ones tests wait on;
	// LeaseTTL and TouchDelay are then ignored. Benchmarks use it to count Redis commands as
	// a user's replica sends them.
	Defaults bool
}

// Start runs n replicas over the same services and instances, sharing the Redis at addr under
// a key prefix of their own.
func Start(t testing.TB, addr string, n int, services []registry.Service, instances []registry.Instance, o Options) []*Replica {
	t.Helper()
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 2 * time.Second
	}
	if o.TouchDelay <= 0 {
		o.TouchDelay = 250 * time.Millisecond
	}
	if o.DegradedFor <= 0 {
		o.DegradedFor = o.LeaseTTL
	}
	prefix := "r" + newPrefix()
	var out []*Replica
	for i := range n {
		out = append(out, startOne(t, addr, prefix, string(rune('a'+i)), services, instances, o))
	}
	return out
}

func startOne(t testing.TB, addr, prefix, name string, services []registry.Service, instances []registry.Instance, o Options) *Replica {
	t.Helper()
	r := &Replica{Name: name, Registry: registry.New()}
	if err := r.Registry.Apply(services, instances); err != nil {
		t.Fatal(err)
	}
	storeOpts := []redisstore.Option{
		redisstore.WithTouchDelay(o.TouchDelay), redisstore.WithReapInterval(50 * time.Millisecond),
		// As long as the harness's ext_proc message timeout: a loaded test machine is slow.
		redisstore.WithOpTimeout(cmp.Or(o.OpTimeout, e2e.MessageTimeout)), redisstore.WithReservationTTL(o.LeaseTTL),
	}
	leaseOpts := []quota.Option{quota.WithTTL(o.LeaseTTL), quota.WithDegradedFor(o.DegradedFor),
		quota.WithCallTimeout(cmp.Or(o.OpTimeout, quota.CallTimeout(e2e.MessageTimeout)))}
	engOpts := []affinity.Option{affinity.WithSweepInterval(20 * time.Millisecond)}
	if o.Defaults {
		storeOpts, leaseOpts, engOpts = nil, nil, nil
	}
	if o.Durability.Mode != "" {
		storeOpts = append(storeOpts, redisstore.WithDurability(o.Durability))
	}
	if o.Addr != nil {
		addr = o.Addr(name)
	}
	if o.Clock != nil {
		clk := o.Clock(name)
		leaseOpts = append(leaseOpts, quota.WithClock(clk))
		storeOpts = append(storeOpts, redisstore.WithClock(clk))
		engOpts = append(engOpts, affinity.WithClock(clk))
	}
	addrs := []string{addr}
	if len(o.Seeds) > 0 {
		addrs = o.Seeds
	}
	st, err := redisstore.New(redisstore.Config{Addrs: addrs, MasterSet: o.MasterSet, KeyPrefix: prefix}, storeOpts...)
	if err != nil {
		t.Fatal(err)
	}
	r.Store = st
	r.Leases = quota.New(st.Client(), prefix, name, leaseOpts...)
	if !o.Unseeded {
		for _, svc := range services {
			if err := r.Leases.Seed(context.Background(), svc.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	engOpts = append(engOpts, affinity.WithSharedSlots(r.Leases.SharedSlots(st)))
	eng, err := affinity.New(r.Registry, st, append(engOpts, o.Engine...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.Engine = eng
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.done.Go(func() { _ = st.Run(ctx) })
	r.done.Go(func() { _ = r.Leases.Run(ctx) })
	r.done.Go(func() { _ = eng.Run(ctx) })
	t.Cleanup(r.Stop)
	select {
	case <-st.Subscribed():
	case <-time.After(10 * time.Second):
		t.Fatal("replicatest: the store did not subscribe to end notifications")
	}
	return r
}

// newPrefix returns a fresh key prefix (after a letter naming its kind).
func newPrefix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b) + ":"
}

// Stop ends the replica gracefully: its loops stop (leases returned, touches flushed) and its
// connections close. Safe to call twice.
func (r *Replica) Stop() {
	r.once.Do(func() {
		r.cancel()
		r.done.Wait()
		r.Store.Close()
	})
}

// Crash ends the replica as kill -9 would for everyone else: nothing is returned or flushed
// (the loops are not told to clean up; the connections are cut).
func (r *Replica) Crash() {
	r.once.Do(func() {
		r.Store.Close() // cut first: the loops' clean-up can reach nothing
		r.cancel()
		r.done.Wait()
	})
}

// Serve gives the replica its own ext_proc and xDS servers on loopback and a harness data
// plane in front of them, configured as tether's generated Envoy config does.
func (r *Replica) Serve(t testing.TB, services []registry.Service) {
	t.Helper()
	ep := extproc.NewServer(r.Engine)
	gs := grpc.NewServer(extproc.ServerOptions()...)
	extproc.Register(gs, ep)
	epLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.ExtProcAddr = epLis.Addr().String()
	go func() { _ = gs.Serve(epLis) }()
	t.Cleanup(gs.Stop)

	xs := xds.NewServer(r.Registry, xds.WithDebounce(5*time.Millisecond))
	xdsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.XDSAddr = xdsLis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	xdsDone := make(chan struct{})
	go func() { defer close(xdsDone); _ = xs.Run(ctx, xdsLis) }()
	t.Cleanup(func() { cancel(); <-xdsDone })

	want := map[string][]string{}
	snap := r.Registry.Snapshot()
	for _, svc := range services {
		for _, in := range snap.Instances(svc.Name) {
			if in.Healthy() {
				want[svc.Name] = append(want[svc.Name], in.HTTPAddr())
			}
		}
	}
	h, err := dataPlane(t, r.ExtProcAddr, r.XDSAddr, services, want)
	if err != nil {
		t.Fatalf("replicatest: data plane of replica %s: %v", r.Name, err)
	}
	r.Harness = h
}

// dataPlane starts a harness in front of one replica's ext_proc and xDS, configured as
// tether's generated Envoy config does (routes from xds.RouteConfiguration, endpoints over
// ADS, the destination header removed early), and waits until its endpoints of each service
// are want's. It is closed when the test ends.
func dataPlane(t testing.TB, extProcAddr, xdsAddr string, services []registry.Service, want map[string][]string) (*envoyharness.Harness, error) {
	rc, err := xds.RouteConfiguration(xds.RouteConfigName, services)
	if err != nil {
		return nil, err
	}
	vhosts, err := envoyharness.RoutesFromConfig(rc, wire.ServiceMetadataKey)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	x, err := envoyharness.WatchXDS(ctx, xdsAddr, xds.DefaultNodeID)
	if err != nil {
		cancel()
		return nil, err
	}
	h, err := envoyharness.New(extProcAddr, x, vhosts,
		envoyharness.WithMessageTimeout(e2e.MessageTimeout),
		envoyharness.WithEarlyHeaderRemoval(wire.DestinationHeader))
	if err != nil {
		_ = x.Close()
		cancel()
		return nil, err
	}
	t.Cleanup(func() { _ = h.Close(); _ = x.Close(); cancel() })
	wctx, wcancel := waitCtx()
	defer wcancel()
	for _, svc := range services {
		if err := x.Wait(wctx, func() bool { return sameSet(x.Addresses(svc.Name), want[svc.Name]) }); err != nil {
			return nil, fmt.Errorf("endpoints of %s: %w", svc.Name, err)
		}
	}
	return h, nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x] == 0 {
			return false
		}
		m[x]--
	}
	return true
}
