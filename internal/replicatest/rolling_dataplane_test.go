package replicatest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/envoyvalidate"
	"github.com/tether-dev/tether/pkg/xds"
)

// rollingDataPlane is what the rolling restart needs of the data plane in front of the
// replicas: the harness or a real Envoy.
type rollingDataPlane interface {
	// URL is the base URL clients send requests to.
	URL() string
	// HostHealthy reports whether the data plane routes side streams to the ext_proc host
	// addr (its health check holds it healthy).
	HostHealthy(addr string) bool
	// StreamsOpenedOn counts the side streams opened on the ext_proc host addr.
	StreamsOpenedOn(addr string) uint64
	// Retries counts side stream retries (the grpc_service retry_policy).
	Retries() uint64
}

// harnessRolling is the harness as a rollingDataPlane.
type harnessRolling struct{ *envoyharness.Harness }

func (h harnessRolling) Retries() uint64 { return h.Stats().Retries }

// envoyRolling is a real Envoy as a rollingDataPlane, read through its admin interface: the
// ext_proc cluster's host health and per-host rq_total (every side stream is one request of
// Envoy's gRPC client on that cluster), and the cluster's upstream_rq_retry.
type envoyRolling struct{ *e2e.EnvoyProc }

func (e envoyRolling) HostHealthy(addr string) bool {
	return e.EnvoyProc.HostHealthy(xds.ExtProcClusterName, addr)
}

func (e envoyRolling) StreamsOpenedOn(addr string) uint64 {
	n, _ := e.HostCounter(xds.ExtProcClusterName, addr, "rq_total") // an admin error reads as none opened: the caller waits on it
	return n
}

func (e envoyRolling) Retries() uint64 {
	n, _ := e.Counter("cluster." + xds.ExtProcClusterName + ".upstream_rq_retry") // reported, not asserted
	return n
}

// startRollingDataPlane generates the Envoy bootstrap of the fleet procs as an operator does
// (`tether bootstrap` with envoy.replicas listing the three replicas, replicatest.FleetBootstrap),
// checks it (checkFleetBootstrap) and puts the data plane of kind in front of the replicas
// from it: a real Envoy (ENVOY_BIN) run on that very bootstrap, waited on until it has every
// service's endpoints over ADS from the replicas and holds every replica healthy; or the
// harness with the bootstrap's ext_proc cluster, health check, retry_policy and
// message_timeout (replicatest.BootstrapDataPlane). Both are closed when the test ends.
func startRollingDataPlane(t *testing.T, kind e2e.Kind, procs []*replicatest.Proc, standby bool) rollingDataPlane {
	t.Helper()
	listen, err := e2e.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := e2e.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	y := replicatest.FleetBootstrap(t, procs, standby, listen, admin)
	bp := checkFleetBootstrap(t, y, procs, standby)
	if kind != e2e.KindEnvoy {
		return harnessRolling{replicatest.BootstrapDataPlane(t, procs, bp)}
	}
	env, err := e2e.StartEnvoy(t, os.Getenv(e2e.EnvoyBinEnv), y, listen, admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("envoy log (tail):\n%s", env.LogTail())
		}
		_ = env.Close()
	})
	want := map[string][]string{}
	for _, in := range procs[0].Instances {
		want[in.Service] = append(want[in.Service], in.HTTPAddr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for svc, addrs := range want {
		if err := env.WaitEndpoints(ctx, svc, addrs); err != nil {
			t.Fatalf("envoy: the endpoints of %s over ADS: %v", svc, err)
		}
	}
	d := envoyRolling{env}
	testutil.EventuallyWithin(t, time.Minute, "envoy's health check holding every replica healthy", func() bool {
		for _, p := range procs {
			if !d.HostHealthy(p.ExtProcAddr) {
				return false
			}
		}
		return true
	})
	return d
}

// checkFleetBootstrap checks the bootstrap y that tether generated for procs, as a real Envoy
// would be given it, and returns its ext_proc settings: it parses into go-control-plane's
// types and passes envoyvalidate (every message's validation rules, recursing into every
// Any, and every cluster reference resolved — the services' clusters come over CDS); its
// ext_proc filter's cluster is the STATIC tether_ext_proc listing every replica's ext_proc
// address (all at priority 0, or the first at 0 and the others at 1 with standby),
// gRPC-health-checked as the wire contract says; the filter's grpc_service has
// xds.ExtProcRetryPolicy and message_timeout e2e.MessageTimeout (the replicas' own); and the
// xDS cluster lists every replica's ADS address the same way.
func checkFleetBootstrap(t *testing.T, y []byte, procs []*replicatest.Proc, standby bool) envoyharness.BootstrapExtProc {
	t.Helper()
	var services []string
	for _, s := range procs[0].Services {
		services = append(services, s.Name)
	}
	if err := envoyvalidate.ValidateBootstrapYAML(y, envoyvalidate.WithClusters(services...)); err != nil {
		t.Fatalf("the generated bootstrap does not validate: %v\n%s", err, y)
	}
	b, err := envoyvalidate.ParseBootstrap(y)
	if err != nil {
		t.Fatal(err)
	}
	bp, err := envoyharness.ExtProcFromBootstrap(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	type hosts struct{ Active, Standby []string }
	split := func(addr func(p *replicatest.Proc) string) hosts {
		var h hosts
		for i, p := range procs {
			if standby && i > 0 {
				h.Standby = append(h.Standby, addr(p))
			} else {
				h.Active = append(h.Active, addr(p))
			}
		}
		return h
	}
	type extProc struct {
		Cluster, Type  string
		Hosts          hosts
		HealthCheck    *envoyharness.HealthCheck
		MessageTimeout time.Duration
	}
	hc := envoyharness.DefaultHealthCheck()
	want := extProc{Cluster: xds.ExtProcClusterName, Type: "STATIC", Hosts: split(func(p *replicatest.Proc) string { return p.ExtProcAddr }),
		HealthCheck: &hc, MessageTimeout: e2e.MessageTimeout}
	got := extProc{Cluster: bp.Cluster, Type: bp.Type, Hosts: hosts{bp.Active, bp.Standby}, HealthCheck: bp.HealthCheck, MessageTimeout: bp.MessageTimeout}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("the generated bootstrap's ext_proc side (-want +got):\n%s", d)
	}
	if !proto.Equal(bp.RetryPolicy, xds.ExtProcRetryPolicy()) {
		t.Errorf("the ext_proc grpc_service's retry_policy is %v, want xds.ExtProcRetryPolicy's %v", bp.RetryPolicy, xds.ExtProcRetryPolicy())
	}
	var xdsHosts *hosts
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == xds.XDSClusterName {
			active, stand, err := envoyharness.ClusterHosts(c)
			if err != nil {
				t.Fatal(err)
			}
			xdsHosts = &hosts{active, stand}
		}
	}
	if xdsHosts == nil {
		t.Fatalf("the generated bootstrap has no static cluster %s", xds.XDSClusterName)
	}
	if d := cmp.Diff(split(func(p *replicatest.Proc) string { return p.XDSAddr }), *xdsHosts, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("the generated bootstrap's %s hosts (-want +got):\n%s", xds.XDSClusterName, d)
	}
	return bp
}
