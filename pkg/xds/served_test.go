package xds_test

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
	"github.com/tether-dev/tether/pkg/xds/xdstest"
)

// byName lists a ResourceSet's resources of one type by name.
func byName(rs *xds.ResourceSet, typeURL string) map[string]proto.Message {
	out := map[string]proto.Message{}
	add := func(name string, m proto.Message) { out[name] = m }
	switch typeURL {
	case resource.ClusterType:
		for _, c := range rs.Clusters {
			add(c.GetName(), c)
		}
	case resource.EndpointType:
		for _, c := range rs.Endpoints {
			add(c.GetClusterName(), c)
		}
	case resource.ListenerType:
		for _, l := range rs.Listeners {
			add(l.GetName(), l)
		}
	case resource.RouteType:
		for _, r := range rs.Routes {
			add(r.GetName(), r)
		}
	}
	return out
}

func sameResources(want, got map[string]proto.Message) bool {
	if len(want) != len(got) {
		return false
	}
	for name, w := range want {
		if !proto.Equal(w, got[name]) {
			return false
		}
	}
	return true
}

// TestServedResourcesAreResources proves that the running server publishes, for every kind of
// node, exactly what the pure policy xds.Resources builds for the node's profile — after the
// first publish, after a service is added (the incremental per-service rebuild) and after an
// instance change (the endpoint-only path). The builder tests of Resources (and Build,
// GRPCResources) therefore test what Envoy and gRPC clients receive.
func TestServedResourcesAreResources(t *testing.T) {
	gwParams := xds.Params{ManagedListeners: true, ListenerAddress: "127.0.0.1:10080"}
	f := start(t, baseServices(), baseInstances(), xds.WithNodeParams("gateway", gwParams))
	grpcMeta, err := structpb.NewStruct(map[string]any{xds.ProfileMetadataKey: "grpc"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := []struct {
		node *corev3.Node
		want xds.Profile
	}{
		{&corev3.Node{Id: "sidecar", UserAgentName: "envoy"}, xds.Profile{Kind: xds.KindEnvoy}},
		{&corev3.Node{Id: "gateway", UserAgentName: "envoy"}, xds.Profile{Kind: xds.KindEnvoy, Params: gwParams}},
		{&corev3.Node{Id: "grpc-by-agent", UserAgentName: "gRPC Go"}, xds.Profile{Kind: xds.KindGRPC}},
		{&corev3.Node{Id: "grpc-by-metadata", UserAgentName: "envoy", Metadata: grpcMeta}, xds.Profile{Kind: xds.KindGRPC}},
	}
	types := []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}
	watchers := map[string]map[string]*xdstest.Watcher{}
	for _, n := range nodes {
		if got := f.srv.NodeProfile(n.node); got != n.want {
			t.Errorf("node %s: profile %+v, want %+v", n.node.GetId(), got, n.want)
		}
		watchers[n.node.GetId()] = map[string]*xdstest.Watcher{}
		for _, typ := range types {
			w, err := xdstest.Watch(context.Background(), f.conn, n.node, typ)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Close)
			watchers[n.node.GetId()][typ] = w
		}
	}
	ctx := waitCtx(t)
	check := func(step string) {
		t.Helper()
		snap := f.reg.Snapshot()
		for _, n := range nodes {
			want, err := xds.Resources(f.srv.NodeProfile(n.node), snap)
			if err != nil {
				t.Fatal(err)
			}
			for _, typ := range types {
				if typ == resource.RouteType && len(want.Routes) == 0 {
					continue // nothing references a route table: a wildcard RDS watch gets no answer
				}
				exp := byName(want, typ)
				if _, err := watchers[n.node.GetId()][typ].Wait(ctx, func(u xdstest.Update) bool { return sameResources(exp, u.Resources) }); err != nil {
					got := watchers[n.node.GetId()][typ].Current().Resources
					t.Fatalf("%s: node %s, %s: served %d resources, Resources has %d: %v", step, n.node.GetId(), typ, len(got), len(exp), err)
				}
			}
		}
	}
	check("initial")

	svcs := append(baseServices(), registry.Service{Name: "docs", Affinity: registry.AffinityHeader, HeaderField: "x-doc", Match: registry.Match{PathPrefix: "/docs"}})
	ins := append(baseInstances(), registry.Instance{Service: "docs", ID: "docs-1", Address: "::1", HTTPPort: 8100, Weight: 2, State: registry.StateActive})
	if err := f.reg.Apply(svcs, ins); err != nil {
		t.Fatal(err)
	}
	check("service added")

	if _, err := f.reg.SetHealth(registry.Key{Service: "web", ID: "web-2"}, registry.HealthUnhealthy); err != nil {
		t.Fatal(err)
	}
	check("instance unhealthy")
}
