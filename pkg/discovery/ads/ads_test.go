package ads_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/discovery/ads"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// mesh is an existing control plane: a go-control-plane management server on loopback whose
// snapshot the test sets.
type mesh struct {
	cache cache.SnapshotCache
	addr  string
	ver   int
	srv   *grpc.Server
}

func startMesh(t *testing.T) *mesh {
	t.Helper()
	// ads=false: go-control-plane's ADS mode answers only requests that name every resource.
	m := &mesh{cache: cache.NewSnapshotCache(false, cache.IDHash{}, nil)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.addr = ln.Addr().String()
	m.srv = grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(m.srv, server.NewServer(context.Background(), m.cache, nil))
	go func() { _ = m.srv.Serve(ln) }()
	t.Cleanup(m.srv.Stop)
	return m
}

type upstream struct {
	addr   string
	port   uint32
	zone   string
	health corev3.HealthStatus
	weight uint32
	prio   uint32
}

// set publishes cluster "mesh-web" (EDS, service_name "mesh-web-eds") with endpoints eps.
func (m *mesh) set(t *testing.T, eps ...upstream) {
	t.Helper()
	m.ver++
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "mesh-web-eds"}
	byLoc := map[[2]any]*endpointv3.LocalityLbEndpoints{}
	for _, e := range eps {
		k := [2]any{e.zone, e.prio}
		l, ok := byLoc[k]
		if !ok {
			l = &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Zone: e.zone}, Priority: e.prio}
			byLoc[k] = l
			cla.Endpoints = append(cla.Endpoints, l)
		}
		lb := &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: e.addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: e.port}}},
			}}},
			HealthStatus: e.health,
		}
		if e.weight > 0 {
			lb.LoadBalancingWeight = wrapperspb.UInt32(e.weight)
		}
		l.LbEndpoints = append(l.LbEndpoints, lb)
	}
	cl := &clusterv3.Cluster{
		Name:                 "mesh-web",
		ConnectTimeout:       durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
			ServiceName: "mesh-web-eds",
		},
	}
	other := &clusterv3.Cluster{Name: "unrelated", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
	snap, err := cache.NewSnapshot(fmt.Sprint(m.ver), map[resource.Type][]types.Resource{
		resource.ClusterType:  {cl, other},
		resource.EndpointType: {cla},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cache.SetSnapshot(context.Background(), "tether-test", snap); err != nil {
		t.Fatal(err)
	}
}

func describe(snap *registry.Snapshot) []string {
	var out []string
	for _, in := range snap.Instances("web") {
		out = append(out, fmt.Sprintf("%s %s:%d %s w%d %s %s", in.ID, in.Address, in.HTTPPort, in.Zone, in.Weight, in.State, in.Health))
	}
	return out
}

// eds returns tether's own EDS for web: zone → "address:port STATUS".
func eds(snap *registry.Snapshot) map[string][]string {
	out := map[string][]string{}
	for _, l := range xds.ClusterLoadAssignment("web", snap.Instances("web")).GetEndpoints() {
		for _, lb := range l.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			out[l.GetLocality().GetZone()] = append(out[l.GetLocality().GetZone()], fmt.Sprintf("%s:%d %s", sa.GetAddress(), sa.GetPortValue(), lb.GetHealthStatus()))
		}
	}
	return out
}

func wait(t *testing.T, r *registry.Registry, want ...string) {
	t.Helper()
	deadline := time.Now().Add(testutil.DefaultWait)
	for !slices.Equal(describe(r.Snapshot()), want) {
		if time.Now().After(deadline) {
			t.Fatalf("instances %q, want %q; sources %+v", describe(r.Snapshot()), want, r.Sources())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func newSessionOn(t *testing.T, f *affinitytest.Fixture) string {
	t.Helper()
	f.Sync(t) // the engine routes by what wait saw in the registry (it lags it on a loaded machine)
	d, err := f.Engine.Decide(context.Background(), affinitytest.HTTP("web", "GET", "/"))
	if err != nil {
		t.Fatal(err)
	}
	d.OnResponse(affinity.Response{Status: 200})
	d.End()
	return d.Instance().ID
}

// Endpoints added, made unhealthy and removed upstream appear in tether's EDS and decisions;
// the stream failing keeps the last good set, and a new server is followed after reconnecting.
func TestEndpointsFromAnExistingControlPlane(t *testing.T) {
	m := startMesh(t)
	web := affinitytest.Service("web", registry.AffinityCookie)
	web.SessionsPerInstance = 2 // tether packs: a new instance takes sessions once the fuller ones are full
	f := affinitytest.New(t, []registry.Service{web}, nil)
	conn, err := grpc.NewClient(m.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	c := ads.New(conn, "tether-test", "tether", f.Registry, []ads.Target{{Service: "web", Cluster: "mesh-web"}},
		ads.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	a := upstream{addr: "198.18.7.1", port: 8080, zone: "z1", health: corev3.HealthStatus_HEALTHY}
	m.set(t, a)
	wait(t, f.Registry, "198.18.7.1-8080 198.18.7.1:8080 z1 w1 active healthy")
	if id := newSessionOn(t, f); id != "198.18.7.1-8080" {
		t.Fatalf("new session on %s", id)
	}

	// Added: a second healthy endpoint (weight 3, zone z2) and a priority-1 one (standby).
	b := upstream{addr: "198.18.7.2", port: 8080, zone: "z2", health: corev3.HealthStatus_HEALTHY, weight: 3}
	s := upstream{addr: "198.18.7.3", port: 8080, zone: "z1", prio: 1}
	m.set(t, a, b, s)
	wait(t, f.Registry,
		"198.18.7.1-8080 198.18.7.1:8080 z1 w1 active healthy",
		"198.18.7.2-8080 198.18.7.2:8080 z2 w3 active healthy",
		"198.18.7.3-8080 198.18.7.3:8080 z1 w1 standby unknown")
	var placed []string
	for range 3 {
		placed = append(placed, newSessionOn(t, f))
	}
	if want := []string{"198.18.7.1-8080", "198.18.7.2-8080", "198.18.7.2-8080"}; !slices.Equal(placed, want) {
		t.Errorf("3 new sessions went to %q, want %q (fill a, then the added b; standby untouched)", placed, want)
	}

	// Made unhealthy: a leaves tether's EDS and takes no new sessions.
	a.health = corev3.HealthStatus_UNHEALTHY
	m.set(t, a, b, s)
	wait(t, f.Registry,
		"198.18.7.1-8080 198.18.7.1:8080 z1 w1 active unhealthy",
		"198.18.7.2-8080 198.18.7.2:8080 z2 w3 active healthy",
		"198.18.7.3-8080 198.18.7.3:8080 z1 w1 standby unknown")
	want := map[string][]string{"z1": {"198.18.7.3:8080 UNKNOWN"}, "z2": {"198.18.7.2:8080 HEALTHY"}}
	if diff := cmp.Diff(want, eds(f.Registry.Snapshot())); diff != "" {
		t.Errorf("tether's EDS with a unhealthy (-want +got):\n%s", diff)
	}
	// Every active instance is unhealthy or full: the next session opens the standby one.
	if id := newSessionOn(t, f); id != "198.18.7.3-8080" {
		t.Fatalf("new session on %s, want the standby endpoint (a unhealthy, b full)", id)
	}

	// Draining upstream: kept for its sessions, no new ones. Then removed.
	b.health = corev3.HealthStatus_DRAINING
	m.set(t, b, s)
	wait(t, f.Registry,
		"198.18.7.2-8080 198.18.7.2:8080 z2 w3 draining unknown",
		"198.18.7.3-8080 198.18.7.3:8080 z1 w1 standby unknown")
	m.set(t, s)
	wait(t, f.Registry, "198.18.7.3-8080 198.18.7.3:8080 z1 w1 active unknown")
	if diff := cmp.Diff(map[string][]string{"z1": {"198.18.7.3:8080 UNKNOWN"}}, eds(f.Registry.Snapshot())); diff != "" {
		t.Errorf("tether's EDS after removals (-want +got):\n%s", diff)
	}

	// The control plane stops: the last good set stays and the source says it is failing.
	m.srv.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := status(f.Registry, ads.SourceName("web"))
		if st.Failing && st.LastError != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream loss not reported: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
	}
	wait(t, f.Registry, "198.18.7.3-8080 198.18.7.3:8080 z1 w1 active unknown")
}

func status(r *registry.Registry, name string) registry.SourceStatus {
	for _, s := range r.Sources() {
		if s.Name == name {
			return s
		}
	}
	return registry.SourceStatus{}
}
