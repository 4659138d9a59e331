// Package e2e runs tether end to end: real upstream HTTP servers, the real engine (registry,
// memstore.Store), tether's ext_proc and xDS servers on loopback gRPC, and a data plane in
// front — the Envoy-faithful harness by default, or a real Envoy started from the bootstrap
// tether generates when ENVOY_BIN names an Envoy binary. Scenarios are written once against
// the DataPlane's URL and run on both.
package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/internal/upstream"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// DataPlane is a running proxy in front of tether.
type DataPlane interface {
	// URL is the base URL clients send requests to (http://ip:port).
	URL() string
	// WaitEndpoints blocks until the data plane routes cluster to exactly addrs (any order),
	// or ctx ends.
	WaitEndpoints(ctx context.Context, cluster string, addrs []string) error
	Close() error
}

// Kind names a data plane implementation.
type Kind string

// Data plane kinds.
const (
	KindHarness Kind = "harness"
	KindEnvoy   Kind = "envoy"
)

// EnvoyBinEnv is the environment variable naming the Envoy binary for KindEnvoy.
const EnvoyBinEnv = "ENVOY_BIN"

// Kinds returns the data planes to run scenarios on: the harness always, Envoy too when
// ENVOY_BIN is set (its subtest is skipped otherwise).
func Kinds() []Kind { return []Kind{KindHarness, KindEnvoy} }

// Instance describes one upstream instance to start.
type Instance struct {
	ID    string
	State registry.State
	// Weight is the instance's balancing weight (0 means 1).
	Weight uint32
}

// Env is a running tether with its upstreams and a data plane.
type Env struct {
	Kind     Kind
	Fixture  *affinitytest.Fixture
	ExtProc  *extproc.Server
	XDS      *xds.Server
	DP       DataPlane
	Services []registry.Service
	// Upstreams maps service → instance id → server.
	Upstreams map[string]map[string]*upstream.Server

	extProcAddr, xdsAddr string
	extProcGRPC          *grpc.Server
}

// StopExtProc stops tether's ext_proc gRPC server at once (connections closed, streams still
// open cut), as when the replica's process is gone.
func (e *Env) StopExtProc() { e.extProcGRPC.Stop() }

// Option configures Start.
type Option func(*options)

type options struct {
	harnessOpts    []envoyharness.Option
	extprocOpts    []extproc.Option
	fixtureOpts    []affinitytest.Option
	noEarlyRemoval bool
}

// WithoutEarlyHeaderRemoval makes the harness skip the connection manager's early removal of
// the destination header (harness only), to show tether's overwrite suffices on its own.
func WithoutEarlyHeaderRemoval() Option { return func(c *options) { c.noEarlyRemoval = true } }

// WithHarnessOptions passes options to the harness (ignored for a real Envoy).
func WithHarnessOptions(o ...envoyharness.Option) Option {
	return func(c *options) { c.harnessOpts = append(c.harnessOpts, o...) }
}

// WithExtProcOptions passes options to the ext_proc server.
func WithExtProcOptions(o ...extproc.Option) Option {
	return func(c *options) { c.extprocOpts = append(c.extprocOpts, o...) }
}

// WithFixtureOptions passes options to the engine fixture (affinitytest.New), e.g. a real clock
// for the engine and the store instead of the fixture's manual one.
func WithFixtureOptions(o ...affinitytest.Option) Option {
	return func(c *options) { c.fixtureOpts = append(c.fixtureOpts, o...) }
}

// ForEachKind runs body once per data plane kind of Kinds(), as subtests named after the kind.
// The envoy subtest is skipped before body runs when ENVOY_BIN is unset, so body starts
// nothing it would throw away.
func ForEachKind(t *testing.T, body func(t *testing.T, kind Kind)) {
	t.Helper()
	for _, kind := range Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			envoyBin(t, kind)
			body(t, kind)
		})
	}
}

// envoyBin returns ENVOY_BIN for KindEnvoy, skipping the test when it is unset ("" for any
// other kind).
func envoyBin(t *testing.T, kind Kind) string {
	t.Helper()
	if kind != KindEnvoy {
		return ""
	}
	bin := os.Getenv(EnvoyBinEnv)
	if bin == "" {
		t.Skipf("%s is not set: skipping the real-Envoy variant", EnvoyBinEnv)
	}
	return bin
}

// Start brings up upstreams for every instance, tether (engine, ext_proc, xDS) and a data plane
// of kind. It skips the test when kind is KindEnvoy and ENVOY_BIN is unset. Everything stops
// when the test ends.
func Start(t *testing.T, kind Kind, services []registry.Service, instances map[string][]Instance, opts ...Option) *Env {
	t.Helper()
	bin := envoyBin(t, kind)
	e := &Env{Kind: kind, Services: services, Upstreams: map[string]map[string]*upstream.Server{}}
	var regInstances []registry.Instance
	for _, svc := range services {
		e.Upstreams[svc.Name] = map[string]*upstream.Server{}
		for _, in := range instances[svc.Name] {
			u, err := upstream.Start(in.ID)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = u.Close() })
			e.Upstreams[svc.Name][in.ID] = u
			st := in.State
			if st == "" {
				st = registry.StateActive
			}
			w := in.Weight
			if w == 0 {
				w = 1
			}
			regInstances = append(regInstances, registry.Instance{Service: svc.Name, ID: in.ID, Address: u.Host(),
				HTTPPort: u.Port(), Weight: w, State: st})
		}
	}
	e.start(t, bin, regInstances, opts)
	return e
}

// StartDataPlane brings up tether (engine, ext_proc, xDS) and a data plane of kind in front of
// instances the caller already runs and owns (their Address and HTTPPort must answer), and
// waits until the data plane routes every service to its healthy instances. The Env's
// Upstreams is empty. It skips the test when kind is KindEnvoy and ENVOY_BIN is unset.
// Everything it starts stops when the test ends.
func StartDataPlane(t *testing.T, kind Kind, services []registry.Service, instances []registry.Instance, opts ...Option) *Env {
	t.Helper()
	bin := envoyBin(t, kind)
	e := &Env{Kind: kind, Services: services, Upstreams: map[string]map[string]*upstream.Server{}}
	e.start(t, bin, instances, opts)
	return e
}

// start runs the engine fixture over instances, tether's ext_proc and xDS servers and the data
// plane (a real Envoy at envoyBin for KindEnvoy), then waits for the data plane's endpoints.
func (e *Env) start(t *testing.T, envoyBin string, instances []registry.Instance, opts []Option) {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	e.Fixture = affinitytest.New(t, e.Services, instances, o.fixtureOpts...)

	// ext_proc on loopback gRPC.
	e.ExtProc = extproc.NewServer(e.Fixture.Engine, o.extprocOpts...)
	gs := grpc.NewServer(extproc.ServerOptions()...)
	extproc.Register(gs, e.ExtProc)
	epLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.extProcAddr = epLis.Addr().String()
	go func() { _ = gs.Serve(epLis) }()
	t.Cleanup(gs.Stop)
	e.extProcGRPC = gs

	// xDS (ADS) on loopback gRPC.
	e.XDS = xds.NewServer(e.Fixture.Registry, xds.WithDebounce(5*time.Millisecond))
	xdsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.xdsAddr = xdsLis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	xdsDone := make(chan struct{})
	go func() { defer close(xdsDone); _ = e.XDS.Run(ctx, xdsLis) }()
	t.Cleanup(func() { cancel(); <-xdsDone })

	switch e.Kind {
	case KindEnvoy:
		e.DP, err = startEnvoy(t, envoyBin, e.Services, e.xdsAddr, e.extProcAddr)
	default:
		e.DP, err = startHarness(ctx, e.Services, e.xdsAddr, e.extProcAddr, !o.noEarlyRemoval, o.harnessOpts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.DP.Close() })
	e.WaitEndpoints(t)
}

// Upstream returns the server of one instance.
func (e *Env) Upstream(service, id string) *upstream.Server { return e.Upstreams[service][id] }

// WaitEndpoints waits until the data plane's endpoints of every service match the registry:
// its healthy instances (the EDS tether serves).
func (e *Env) WaitEndpoints(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap := e.Fixture.Registry.Snapshot()
	for _, svc := range e.Services {
		var want []string
		for _, in := range snap.Instances(svc.Name) {
			if in.Healthy() {
				want = append(want, in.HTTPAddr())
			}
		}
		slices.Sort(want)
		if err := e.DP.WaitEndpoints(ctx, svc.Name, want); err != nil {
			t.Fatalf("e2e: data plane endpoints of %s: %v", svc.Name, err)
		}
	}
}

// Key returns the registry key of an instance.
func Key(service, id string) registry.Key { return registry.Key{Service: service, ID: id} }

// RequestsInFlight sums the request slots in use over a service's instances.
func (e *Env) RequestsInFlight(t *testing.T, service string) int {
	t.Helper()
	n := 0
	for _, u := range e.Fixture.Usage(t, service) {
		n += u[1]
	}
	return n
}

// WaitSlotsReleased waits until no request slot of any service is in use.
func (e *Env) WaitSlotsReleased(t *testing.T) {
	t.Helper()
	for _, svc := range e.Services {
		testutil.Eventually(t, fmt.Sprintf("request slots of %s back to 0", svc.Name), func() bool {
			return e.RequestsInFlight(t, svc.Name) == 0
		})
	}
}
