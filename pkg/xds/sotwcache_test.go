package xds

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
)

func sotwTestResources(t *testing.T, typ resource.Type, msgs ...proto.Message) *sotwResources {
	t.Helper()
	items, err := hashAll(msgs)
	if err != nil {
		t.Fatal(err)
	}
	return newSOTWResources(typ, items, itemsVersion(items))
}

// sotwTestWatch opens a watch as go-control-plane's ADS server does for req and returns its
// channel.
func sotwTestWatch(t *testing.T, c *sotwCache, req *cache.Request) chan cache.Response {
	t.Helper()
	out := make(chan cache.Response, types.UnknownType)
	if _, err := c.CreateWatch(req, stream.NewSotwSubscription(req.GetResourceNames(), true), out); err != nil {
		t.Fatal(err)
	}
	return out
}

func sotwTestReceive(t *testing.T, out chan cache.Response) (version string, names []string, resp cache.Response) {
	t.Helper()
	select {
	case resp = <-out:
	default:
		t.Fatal("no response")
	}
	dr, err := resp.GetDiscoveryResponse()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range dr.GetResources() {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, cache.GetResourceName(m))
	}
	return dr.GetVersionInfo(), names, resp
}

func sotwTestNone(t *testing.T, out chan cache.Response, what string) {
	t.Helper()
	select {
	case r := <-out:
		t.Errorf("%s: unexpected response at %s", what, r.GetResponseVersion())
	default:
	}
}

func TestSOTWCacheSharesResourcesAndAnswersWhatAClientLacks(t *testing.T) {
	envoy := &corev3.Node{Id: "e"}
	grpcNode := &corev3.Node{Id: "g", UserAgentName: "gRPC Go"}
	ns := nodes{byNode: map[string]Params{}}
	c := newSOTWCache(ns.key, func(key string) bool { return key != DefaultGRPCSnapshot })
	clusters := sotwTestResources(t, resource.ClusterType, &clusterv3.Cluster{Name: "a"}, &clusterv3.Cluster{Name: "b"})
	for _, key := range []string{DefaultEnvoySnapshot, DefaultGRPCSnapshot} {
		c.set(key, map[resource.Type]*sotwResources{resource.ClusterType: clusters, resource.RouteType: sotwTestResources(t, resource.RouteType)})
	}

	// Two wildcard streams get the same Anys (marshalled once) at the type's content version.
	one := sotwTestWatch(t, c, &cache.Request{Node: envoy, TypeUrl: resource.ClusterType})
	two := sotwTestWatch(t, c, &cache.Request{Node: envoy, TypeUrl: resource.ClusterType})
	v1, names, r1 := sotwTestReceive(t, one)
	_, _, r2 := sotwTestReceive(t, two)
	d1, _ := r1.GetDiscoveryResponse()
	d2, _ := r2.GetDiscoveryResponse()
	if v1 != clusters.version || len(names) != 2 || names[0] != "a" || names[1] != "b" {
		t.Errorf("wildcard response = %s %v, want %s [a b]", v1, names, clusters.version)
	}
	if d1 == d2 || d1.Resources[0] != d2.Resources[0] {
		t.Error("two streams' responses should be distinct messages sharing one marshalled Any per resource")
	}

	// The ACK (same version, a nonce) waits; a new stream holding that version is answered, as
	// go-control-plane's SnapshotCache answers a stream's first request.
	acked := sotwTestWatch(t, c, &cache.Request{Node: envoy, TypeUrl: resource.ClusterType, VersionInfo: v1, ResponseNonce: "1"})
	sotwTestNone(t, acked, "ACK of the current version")
	fresh := sotwTestWatch(t, c, &cache.Request{Node: envoy, TypeUrl: resource.ClusterType, VersionInfo: v1})
	sotwTestReceive(t, fresh)

	// A named subscription gets its subset at a version of its own; naming every resource is
	// holding the wildcard's version.
	named := sotwTestWatch(t, c, &cache.Request{Node: grpcNode, TypeUrl: resource.ClusterType, ResourceNames: []string{"b", "missing"}})
	vb, names, _ := sotwTestReceive(t, named)
	if len(names) != 1 || names[0] != "b" || vb == v1 {
		t.Errorf("named [b missing] = %s %v, want [b] at a version other than %s", vb, names, v1)
	}
	again := sotwTestWatch(t, c, &cache.Request{Node: grpcNode, TypeUrl: resource.ClusterType, VersionInfo: vb, ResponseNonce: "2", ResourceNames: []string{"b", "missing"}})
	sotwTestNone(t, again, "ACK of the named subset")
	widened := sotwTestWatch(t, c, &cache.Request{Node: grpcNode, TypeUrl: resource.ClusterType, VersionInfo: vb, ResponseNonce: "3", ResourceNames: []string{"a", "b"}})
	if v, names, _ := sotwTestReceive(t, widened); v != v1 || len(names) != 2 {
		t.Errorf("named [a b] = %s %v, want every cluster at %s", v, names, v1)
	}

	// An Envoy (ADS) named request waits until every name exists; then it is answered.
	route := sotwTestWatch(t, c, &cache.Request{Node: envoy, TypeUrl: resource.RouteType, ResourceNames: []string{"r"}})
	sotwTestNone(t, route, "ADS request for a route that does not exist")
	c.set(DefaultEnvoySnapshot, map[resource.Type]*sotwResources{resource.RouteType: sotwTestResources(t, resource.RouteType, &routev3.RouteConfiguration{Name: "r"})})
	if _, names, _ := sotwTestReceive(t, route); len(names) != 1 || names[0] != "r" {
		t.Errorf("route response = %v, want [r]", names)
	}

	// A change answers the waiting ACK, and only it.
	c.set(DefaultEnvoySnapshot, map[resource.Type]*sotwResources{resource.ClusterType: sotwTestResources(t, resource.ClusterType, &clusterv3.Cluster{Name: "a"})})
	if v, names, _ := sotwTestReceive(t, acked); v == v1 || len(names) != 1 {
		t.Errorf("after removing b: %s %v, want [a] at a new version", v, names)
	}
	sotwTestNone(t, again, "a gRPC watch when only the Envoy key changed")
}
