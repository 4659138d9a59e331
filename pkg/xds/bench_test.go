package xds_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
	"github.com/tether-dev/tether/pkg/xds/xdstest"
)

const (
	benchServices  = 1000
	benchInstances = 10
)

func benchModel(weight uint32) ([]registry.Service, []registry.Instance) {
	var svcs []registry.Service
	var ins []registry.Instance
	for s := range benchServices {
		name := fmt.Sprintf("svc-%04d", s)
		svcs = append(svcs, registry.Service{
			Name: name, Affinity: registry.AffinityCookie, Balancing: registry.BalanceRoundRobin,
			Match: registry.Match{PathPrefix: "/" + name}, ConnectTimeout: 2 * time.Second,
		})
		for i := range benchInstances {
			ins = append(ins, registry.Instance{
				Service: name, ID: fmt.Sprintf("i%02d", i),
				Address: fmt.Sprintf("10.%d.%d.%d", s/256, s%256, i+1), HTTPPort: 8080,
				Weight: weight, Zone: fmt.Sprintf("z%d", i%3), State: registry.StateActive,
			})
		}
	}
	return svcs, ins
}

func heapMB() float64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

func endpointCount(u xdstest.Update, svc string) int {
	cla, _ := u.Resources[svc].(*endpointv3.ClusterLoadAssignment)
	n := 0
	for _, l := range cla.GetEndpoints() {
		n += len(l.GetLbEndpoints())
	}
	return n
}

// BenchmarkRegistryChangeToClient measures, at 1,000 services × 10 instances (10,000
// endpoints), the time from a registry change to a state-of-the-world ADS client (go-control-
// plane's own) holding the new endpoints, over loopback gRPC, with the debounce off (the
// default 50 ms debounce adds up to 50 ms by design). It also reports the control plane's heap.
//
//   - one-endpoint: one instance's health flips; the client must see that service's CLA change.
//   - all-endpoints: every instance's weight changes (a reload touching all 10,000 endpoints).
//   - full-resync: a new client (a restarted Envoy) connects and receives all clusters and
//     endpoints.
func BenchmarkRegistryChangeToClient(b *testing.B) {
	base := heapMB()
	reg := registry.New()
	svcs, ins := benchModel(1)
	if err := reg.Apply(svcs, ins); err != nil {
		b.Fatal(err)
	}
	withRegistry := heapMB()
	srv := xds.NewServer(reg, xds.WithDebounce(0))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	testutil.Eventually(b, "the first publish", func() bool { return srv.Stats().Publishes > 0 })
	published := heapMB()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()

	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	watch := func(node, typeURL string) *xdstest.Watcher {
		w, err := xdstest.Watch(ctx, conn, &corev3.Node{Id: node}, typeURL)
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	allThere := func(u xdstest.Update) bool { return len(u.Resources) == benchServices }
	cds, eds := watch("bench", resource.ClusterType), watch("bench", resource.EndpointType)
	defer cds.Close()
	defer eds.Close()
	if _, err := cds.Wait(wctx, allThere); err != nil {
		b.Fatal(err)
	}
	if _, err := eds.Wait(wctx, allThere); err != nil {
		b.Fatal(err)
	}
	connected := heapMB()
	b.Logf("heap: registry %.1f MB; + control plane after publish %.1f MB; + one connected CDS/EDS client (both sides, same process) %.1f MB",
		withRegistry-base, published-withRegistry, connected-published)

	b.Run("one-endpoint", func(b *testing.B) {
		flipEndpoints(wctx, b, reg, eds)
		b.ReportMetric(published-withRegistry, "cp-heap-MB")
		b.ReportMetric(connected-published, "+client-heap-MB")
	})

	b.Run("all-endpoints", func(b *testing.B) {
		w := uint32(1)
		for b.Loop() {
			w++
			svcs, ins := benchModel(w)
			if err := reg.Apply(svcs, ins); err != nil {
				b.Fatal(err)
			}
			if _, err := eds.Wait(wctx, func(u xdstest.Update) bool {
				for s := range benchServices {
					cla, _ := u.Resources[fmt.Sprintf("svc-%04d", s)].(*endpointv3.ClusterLoadAssignment)
					if cla.GetEndpoints()[0].GetLbEndpoints()[0].GetLoadBalancingWeight().GetValue() != w {
						return false
					}
				}
				return true
			}); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("one-endpoint/debounce=50ms", func(b *testing.B) {
		// The same change through a second server with the default debounce (the production
		// setting): the extra latency is the debounce window, by design.
		srv2 := xds.NewServer(reg)
		lis2, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		done2 := make(chan error, 1)
		ctx2, cancel2 := context.WithCancel(ctx)
		go func() { done2 <- srv2.Run(ctx2, lis2) }()
		defer func() {
			cancel2()
			if err := <-done2; err != nil {
				b.Error(err)
			}
		}()
		conn2, err := grpc.NewClient("passthrough:///"+lis2.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = conn2.Close() }()
		eds2, err := xdstest.Watch(ctx, conn2, &corev3.Node{Id: "bench"}, resource.EndpointType)
		if err != nil {
			b.Fatal(err)
		}
		defer eds2.Close()
		if _, err := eds2.Wait(wctx, allThere); err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			svc := fmt.Sprintf("svc-%04d", i%benchServices)
			i++
			before := endpointCount(eds2.Current(), svc)
			h, want := registry.HealthUnhealthy, before-1
			if before < benchInstances {
				h, want = registry.HealthHealthy, before+1
			}
			if _, err := reg.SetHealth(registry.Key{Service: svc, ID: "i00"}, h); err != nil {
				b.Fatal(err)
			}
			if _, err := eds2.Wait(wctx, func(u xdstest.Update) bool { return endpointCount(u, svc) == want }); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("registry-only", func(b *testing.B) {
		// The floor: the registry change itself (its snapshot copy and comparison), nothing
		// waiting for xDS. Part of every measurement above.
		i := 0
		for b.Loop() {
			h := registry.HealthUnhealthy
			if (i/benchServices)%2 == 1 {
				h = registry.HealthHealthy
			}
			if _, err := reg.SetHealth(registry.Key{Service: fmt.Sprintf("svc-%04d", i%benchServices), ID: "i01"}, h); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.StopTimer()
		for j := range benchServices { // restore, and let the server settle
			if _, err := reg.SetHealth(registry.Key{Service: fmt.Sprintf("svc-%04d", j), ID: "i01"}, registry.HealthUnknown); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := eds.Wait(wctx, func(u xdstest.Update) bool { return endpointCount(u, "svc-0999") == benchInstances }); err != nil {
			b.Fatal(err)
		}
	})

	b.Run("full-resync", func(b *testing.B) {
		n := 0
		for b.Loop() {
			n++
			node := fmt.Sprintf("resync-%d", n)
			c, e := watch(node, resource.ClusterType), watch(node, resource.EndpointType)
			if _, err := c.Wait(wctx, allThere); err != nil {
				b.Fatal(err)
			}
			if _, err := e.Wait(wctx, allThere); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			c.Close()
			e.Close()
			b.StartTimer()
		}
	})
}

// BenchmarkBaselineFullSnapshot is the side-by-side baseline for one-endpoint: the textbook
// go-control-plane server (one SnapshotCache holding clusters and endpoints, a complete new
// snapshot built and set on every registry generation, no debounce) fed by the same registry
// and consumed by the same client. Every change re-sends all 1,000 CLAs.
func BenchmarkBaselineFullSnapshot(b *testing.B) {
	reg := registry.New()
	svcs, ins := benchModel(1)
	if err := reg.Apply(svcs, ins); err != nil {
		b.Fatal(err)
	}
	snapshots := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	publish := func(snap *registry.Snapshot) error {
		rs, err := xds.Build(snap, xds.Params{})
		if err != nil {
			return err
		}
		s, err := rs.Snapshot()
		if err != nil {
			return err
		}
		if err := s.Consistent(); err != nil {
			return err
		}
		return snapshots.SetSnapshot(context.Background(), "bench", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	updates := reg.Watch(ctx)
	if err := publish(<-updates); err != nil {
		b.Fatal(err)
	}
	go func() {
		for snap := range updates {
			if err := publish(snap); err != nil {
				b.Error(err)
			}
		}
	}()
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, snapshots, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	eds, err := xdstest.Watch(ctx, conn, &corev3.Node{Id: "bench"}, resource.EndpointType)
	if err != nil {
		b.Fatal(err)
	}
	defer eds.Close()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	if _, err := eds.Wait(wctx, func(u xdstest.Update) bool { return len(u.Resources) == benchServices }); err != nil {
		b.Fatal(err)
	}
	b.Run("one-endpoint", func(b *testing.B) {
		flipEndpoints(wctx, b, reg, eds)
	})
}

// flipEndpoints is the timed loop of the one-endpoint benchmarks: each iteration flips the
// health of one instance of the next service and waits until the client's EDS shows it.
func flipEndpoints(ctx context.Context, b *testing.B, reg *registry.Registry, eds *xdstest.Watcher) {
	b.Helper()
	i := 0
	for b.Loop() {
		svc := fmt.Sprintf("svc-%04d", i%benchServices)
		i++
		before := endpointCount(eds.Current(), svc)
		h, want := registry.HealthUnhealthy, before-1
		if before < benchInstances {
			h, want = registry.HealthHealthy, before+1
		}
		if _, err := reg.SetHealth(registry.Key{Service: svc, ID: "i00"}, h); err != nil {
			b.Fatal(err)
		}
		if _, err := eds.Wait(ctx, func(u xdstest.Update) bool { return endpointCount(u, svc) == want }); err != nil {
			b.Fatal(err)
		}
	}
}
