package xds_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcxds "google.golang.org/grpc/xds"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// deltaStream is a raw delta ADS stream that ACKs every response, as Envoy does.
type deltaStream struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	resps  chan *discoveryv3.DeltaDiscoveryResponse
}

func openDelta(t *testing.T, ctx context.Context, conn grpc.ClientConnInterface) *deltaStream {
	t.Helper()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := &deltaStream{t: t, stream: s, resps: make(chan *discoveryv3.DeltaDiscoveryResponse, 64)}
	go func() {
		defer close(d.resps)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			d.resps <- r
		}
	}()
	return d
}

func (d *deltaStream) send(req *discoveryv3.DeltaDiscoveryRequest) {
	d.t.Helper()
	if err := d.stream.Send(req); err != nil {
		d.t.Fatal(err)
	}
}

// next returns the next response (and ACKs it), failing after timeout.
func (d *deltaStream) next(timeout time.Duration) *discoveryv3.DeltaDiscoveryResponse {
	d.t.Helper()
	select {
	case r, ok := <-d.resps:
		if !ok {
			d.t.Fatal("delta stream closed")
		}
		d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
		return r
	case <-time.After(timeout):
		d.t.Fatalf("no delta response within %v", timeout)
		return nil
	}
}

// quiet reports whether no response arrives within d.
func (d *deltaStream) quiet(wait time.Duration) bool {
	select {
	case r := <-d.resps:
		d.t.Logf("unexpected response: %v", r)
		return false
	case <-time.After(wait):
		return true
	}
}

func names(resources []*discoveryv3.Resource) []string {
	var out []string
	for _, r := range resources {
		out = append(out, r.GetName())
	}
	slices.Sort(out)
	return out
}

func TestDeltaADS(t *testing.T) {
	f := start(t, baseServices(), baseInstances())
	ctx := waitCtx(t)
	d := openDelta(t, ctx, f.conn)

	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "delta-envoy"}, TypeUrl: resource.ClusterType})
	r := d.next(5 * time.Second)
	if r.GetTypeUrl() != resource.ClusterType || !slices.Equal(names(r.GetResources()), []string{"api", "web"}) {
		t.Fatalf("first delta response = %s %v", r.GetTypeUrl(), names(r.GetResources()))
	}
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web", "api"}})
	r = d.next(5 * time.Second)
	if r.GetTypeUrl() != resource.EndpointType || !slices.Equal(names(r.GetResources()), []string{"api", "web"}) {
		t.Fatalf("EDS delta response = %s %v", r.GetTypeUrl(), names(r.GetResources()))
	}
	for _, res := range r.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := res.GetResource().UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		if want := xds.ClusterLoadAssignment(res.GetName(), f.reg.Snapshot().Instances(res.GetName())); !proto.Equal(want, cla) {
			t.Errorf("%s: got %v, want %v", res.GetName(), cla, want)
		}
	}

	t.Run("one endpoint change is one resource", func(t *testing.T) {
		if err := f.reg.Register(registry.Instance{Service: "web", ID: "web-9", Address: "127.0.0.1", HTTPPort: 8089}); err != nil {
			t.Fatal(err)
		}
		r := d.next(5 * time.Second)
		if r.GetTypeUrl() != resource.EndpointType || !slices.Equal(names(r.GetResources()), []string{"web"}) || len(r.GetRemovedResources()) != 0 {
			t.Fatalf("delta = %s %v removed %v, want the web CLA only", r.GetTypeUrl(), names(r.GetResources()), r.GetRemovedResources())
		}
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := r.GetResources()[0].GetResource().UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		if got := endpointStatus(cla); !slices.Contains(got, "8089:UNKNOWN") {
			t.Errorf("web endpoints %v lack the new instance", got)
		}
		if r.GetResources()[0].GetVersion() == "" {
			t.Error("delta resource without a version")
		}
		if !d.quiet(200 * time.Millisecond) {
			t.Error("more than one response for one change")
		}
	})

	t.Run("removed service is a removal", func(t *testing.T) {
		if err := f.reg.Apply(baseServices()[:1], baseInstances()[:3]); err != nil {
			t.Fatal(err)
		}
		// web-9 leaves with the reload too, so a web update may arrive in between.
		removed := map[string][]string{}
		for len(removed) < 2 {
			r := d.next(5 * time.Second)
			if len(r.GetRemovedResources()) > 0 {
				removed[r.GetTypeUrl()] = r.GetRemovedResources()
			}
		}
		want := map[string][]string{resource.ClusterType: {"api"}, resource.EndpointType: {"api"}}
		if diff := cmp.Diff(want, removed); diff != "" {
			t.Errorf("removals (-want +got):\n%s", diff)
		}
	})

	st := waitStatus(t, f.srv, func(st []xds.NodeStatus) bool { return len(st) == 1 && allAcked(st[0]) })
	if len(st) != 1 || st[0].ID != "delta-envoy" || st[0].Streams != 1 || !allAcked(st[0]) {
		t.Errorf("delta node status = %+v", st)
	}
}

// backend is a real gRPC server answering grpc.health.v1 and naming itself in a response header.
type backend struct {
	id   string
	port int
	srv  *grpc.Server
}

func startBackend(t *testing.T, id string) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := grpc.SetHeader(ctx, metadata.Pairs("backend", id)); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return &backend{id: id, port: lis.Addr().(*net.TCPAddr).Port, srv: srv}
}

// TestGRPCClientFollowsEndpoints drives grpc-go's own xDS resolver and balancers against tether:
// LDS (api_listener) + inline routes with a header hash policy, CDS with ring_hash, EDS shared
// with Envoy; RPCs reach real backends, stick per session key, and follow instance changes.
func TestGRPCClientFollowsEndpoints(t *testing.T) {
	backends := map[string]*backend{}
	var instances []registry.Instance
	for _, id := range []string{"b1", "b2", "b3"} {
		b := startBackend(t, id)
		backends[id] = b
		instances = append(instances, registry.Instance{Service: "echo", ID: id, Address: "127.0.0.1", HTTPPort: b.port, Weight: 1, State: registry.StateActive})
	}
	// A second service: the client subscribes to echo's listener and cluster by name and must be
	// answered although the snapshot holds other names too.
	other := startBackend(t, "other")
	instances = append(instances, registry.Instance{Service: "other", ID: "o1", Address: "127.0.0.1", HTTPPort: other.port, Weight: 1, State: registry.StateActive})
	f := start(t, []registry.Service{{Name: "echo", HeaderField: "x-session"}, {Name: "other"}}, instances)

	bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": "passthrough:///%s", "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "grpc-client"}}`, f.addr)
	res, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///echo", grpc.WithResolvers(res), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	client := healthpb.NewHealthClient(cc)
	ctx := waitCtx(t)
	call := func(key string) (string, error) {
		var hdr metadata.MD
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "x-session", key), 5*time.Second)
		defer cancel()
		if _, err := client.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.WaitForReady(true)); err != nil {
			return "", err
		}
		if v := hdr.Get("backend"); len(v) == 1 {
			return v[0], nil
		}
		return "", io.ErrUnexpectedEOF
	}

	owner := map[string]string{}
	seen := map[string]bool{}
	for i := range 60 {
		key := "session-" + strconv.Itoa(i)
		for range 3 {
			b, err := call(key)
			if err != nil {
				t.Fatalf("RPC for %s: %v", key, err)
			}
			if prev, ok := owner[key]; ok && prev != b {
				t.Fatalf("key %s went to %s, then %s: ring hash on the header must stick", key, prev, b)
			}
			owner[key] = b
			seen[b] = true
		}
	}
	if len(seen) != 3 {
		t.Errorf("60 session keys reached backends %v, want all of b1, b2, b3", seen)
	}

	victim := owner["session-0"]
	if err := f.reg.Deregister(registry.Key{Service: "echo", ID: victim}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "session-0 to leave removed backend "+victim, func() bool {
		b, err := call("session-0")
		if err != nil {
			t.Fatal(err)
		}
		return b != victim
	})
	for i := range 60 {
		b, err := call("session-" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if b == victim {
			t.Errorf("session-%d reached removed backend %s", i, victim)
		}
	}

	// Bring it back: it takes traffic again.
	var back registry.Instance
	for _, in := range instances {
		if in.Service == "echo" && in.ID == victim {
			back = in
		}
	}
	if err := f.reg.Register(back); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "re-registered backend "+victim+" to get traffic", func() bool {
		for i := range 60 {
			if b, err := call("session-" + strconv.Itoa(i)); err == nil && b == victim {
				return true
			}
		}
		return false
	})

	st := waitStatus(t, f.srv, func(st []xds.NodeStatus) bool { return len(st) == 1 && allAcked(st[0]) })
	if len(st) != 1 || st[0].Snapshot != xds.DefaultGRPCSnapshot || st[0].LastNACK != nil {
		t.Errorf("gRPC client status = %+v, want the gRPC snapshot and no NACK", st)
	}
}
