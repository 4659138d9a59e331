package xds

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/pkg/registry"
)

// Kind is the kind of xDS client a set of resources is built for.
type Kind int

const (
	// KindEnvoy is an Envoy proxy: per service an EDS cluster balanced by override_host (see
	// Cluster); with Params.ManagedListeners also the data-plane Listener and its
	// RouteConfiguration.
	KindEnvoy Kind = iota
	// KindGRPC is a proxyless gRPC client (see GRPCResources): per service an api_listener with
	// its route inline and a ring_hash EDS cluster; with Params.GRPCExtProcTarget the listener
	// runs tether's ext_proc filter (GRPCExternalProcessor). No other Params apply.
	KindGRPC
)

func (k Kind) String() string {
	if k == KindGRPC {
		return "grpc"
	}
	return "envoy"
}

// Profile is what one snapshot is built for: a kind of client and, for Envoy, its Params.
// Every node the Server serves maps to exactly one Profile (Server.NodeProfile), and the same
// Profile always yields the same resources for the same registry state.
type Profile struct {
	Kind   Kind
	Params Params
}

// Resources is the resource policy of tether's xDS: the complete set of resources a client
// of profile pr receives for a registry snapshot, every list sorted by name. It is pure. The
// running Server publishes exactly these resources (it builds them incrementally from the same
// serviceResources and sharedResources, one service at a time), so a test of Resources is a
// test of what the Server serves (TestServedResourcesAreResources holds the two together).
func Resources(pr Profile, snap *registry.Snapshot) (*ResourceSet, error) {
	rs := &ResourceSet{}
	services := snap.Services()
	for _, svc := range services {
		msgs, err := serviceResources(pr, svc)
		if err != nil {
			return nil, err
		}
		if err := rs.add(msgs...); err != nil {
			return nil, err
		}
		rs.Endpoints = append(rs.Endpoints, ClusterLoadAssignment(svc.Name, snap.Instances(svc.Name)))
	}
	shared, err := sharedResources(pr, services)
	if err != nil {
		return nil, err
	}
	if err := rs.add(shared...); err != nil {
		return nil, err
	}
	rs.sort()
	return rs, nil
}

// serviceResources returns what one service contributes to a profile's snapshot, besides its
// ClusterLoadAssignment (which is the same for every profile and published separately).
func serviceResources(pr Profile, svc registry.Service) ([]proto.Message, error) {
	if pr.Kind == KindGRPC {
		l, c, err := grpcService(svc, pr.Params)
		if err != nil {
			return nil, err
		}
		return []proto.Message{c, l}, nil
	}
	c, err := Cluster(svc, pr.Params)
	if err != nil {
		return nil, err
	}
	return []proto.Message{c}, nil
}

// sharedResources returns the resources built from all services together: the managed
// listener and route table of an Envoy profile with Params.ManagedListeners, nothing otherwise.
func sharedResources(pr Profile, services []registry.Service) ([]proto.Message, error) {
	if !pr.hasShared() {
		return nil, nil
	}
	l, err := Listener(pr.Params)
	if err != nil {
		return nil, err
	}
	r, err := RouteConfiguration(RouteConfigName, services)
	if err != nil {
		return nil, err
	}
	return []proto.Message{l, r}, nil
}

func (pr Profile) hasShared() bool { return pr.Kind == KindEnvoy && pr.Params.ManagedListeners }

// ResourceSet is one complete set of xDS resources for one kind of client, every list sorted
// by resource name. A ResourceSet is a value the builders return; its protos must not be
// modified once it has been published.
type ResourceSet struct {
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
}

// Build builds the resources an Envoy node receives for a registry snapshot:
// Resources(Profile{Kind: KindEnvoy, Params: p}, snap).
func Build(snap *registry.Snapshot, p Params) (*ResourceSet, error) {
	return Resources(Profile{Kind: KindEnvoy, Params: p}, snap)
}

// GRPCResources builds the resources a proxyless gRPC client (grpc-go's xDS resolver, target
// "xds:///<service>") receives: Resources(Profile{Kind: KindGRPC}, snap). Per service: an
// api_listener named after the service whose connection manager carries its route
// configuration inline (go-control-plane's Consistent check does not follow RDS names from
// api_listeners), a route hashing the session header (svc.HeaderField, default
// DefaultSessionHeader), an EDS cluster balanced with ring_hash (xxHash, as gRPC requires), and
// the same ClusterLoadAssignment Envoy receives, without tether's ext_proc filter
// (Resources with Params.GRPCExtProcTarget adds it). gRPC has no override_host: placement is
// converged, session-keyed consistent hashing over the same live endpoint set, never tether's
// pick; the engine mirrors that ring (package ringhash, affinity.Request.GRPCRing) to count each
// call where it goes, so the endpoints and weights here and the engine's mirror must change
// together (deploy/grpc TestRingMirrorFollowsEDS holds them together; deploy/grpc/README.md).
func GRPCResources(snap *registry.Snapshot) (*ResourceSet, error) {
	return Resources(Profile{Kind: KindGRPC}, snap)
}

func (rs *ResourceSet) add(msgs ...proto.Message) error {
	for _, m := range msgs {
		switch m := m.(type) {
		case *clusterv3.Cluster:
			rs.Clusters = append(rs.Clusters, m)
		case *endpointv3.ClusterLoadAssignment:
			rs.Endpoints = append(rs.Endpoints, m)
		case *listenerv3.Listener:
			rs.Listeners = append(rs.Listeners, m)
		case *routev3.RouteConfiguration:
			rs.Routes = append(rs.Routes, m)
		default:
			return fmt.Errorf("xds: unexpected resource %T", m)
		}
	}
	return nil
}

func (rs *ResourceSet) sort() {
	slices.SortFunc(rs.Clusters, func(a, b *clusterv3.Cluster) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(rs.Endpoints, func(a, b *endpointv3.ClusterLoadAssignment) int { return cmp.Compare(a.ClusterName, b.ClusterName) })
	slices.SortFunc(rs.Listeners, func(a, b *listenerv3.Listener) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(rs.Routes, func(a, b *routev3.RouteConfiguration) int { return cmp.Compare(a.Name, b.Name) })
}

// Snapshot returns the set as a go-control-plane snapshot. Each resource type carries its own
// version, a hash of the type's deterministically marshalled content (see ContentVersion), so a
// version changes exactly when that type's content changes. All four types are present even
// when empty, so a client asking for a type tether does not serve gets an empty answer instead
// of waiting. The snapshot is not checked: call Consistent (or pkg/envoyvalidate).
func (rs *ResourceSet) Snapshot() (*cache.Snapshot, error) {
	m := map[resource.Type][]item{}
	for typ, list := range map[resource.Type][]proto.Message{
		resource.ClusterType:  toMessages(rs.Clusters),
		resource.EndpointType: toMessages(rs.Endpoints),
		resource.ListenerType: toMessages(rs.Listeners),
		resource.RouteType:    toMessages(rs.Routes),
	} {
		items, err := hashAll(list)
		if err != nil {
			return nil, err
		}
		m[typ] = items
	}
	return newSnapshot(m), nil
}

func toMessages[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

// typeOf is the xDS type URL of a resource tether builds.
func typeOf(m proto.Message) resource.Type {
	switch m.(type) {
	case *clusterv3.Cluster:
		return resource.ClusterType
	case *endpointv3.ClusterLoadAssignment:
		return resource.EndpointType
	case *listenerv3.Listener:
		return resource.ListenerType
	case *routev3.RouteConfiguration:
		return resource.RouteType
	}
	return ""
}

// item is one built resource with its name and content hash.
type item struct {
	name string
	res  types.Resource
	sum  uint64
	wire []byte // res's deterministic wire form (nil for endpoints, which their cache marshals)
}

func hashAll(list []proto.Message) ([]item, error) {
	out := make([]item, 0, len(list))
	for _, m := range list {
		it, err := newItem(m)
		if err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	slices.SortFunc(out, func(a, b item) int { return cmp.Compare(a.name, b.name) })
	return out, nil
}

func newItem(m proto.Message) (item, error) {
	b, err := deterministic().Marshal(m)
	if err != nil {
		return item{}, fmt.Errorf("marshal %T: %w", m, err)
	}
	return item{name: cache.GetResourceName(m), res: m, sum: xxhash.Sum64(b), wire: b}, nil
}

// ContentVersion is the version of a list of resources: a hash over each resource's name and
// deterministic wire form, in name order. Equal content always gives the same version.
func ContentVersion(list []proto.Message) (string, error) {
	items, err := hashAll(list)
	if err != nil {
		return "", err
	}
	return itemsVersion(items), nil
}

// itemsVersion hashes (name, content hash) pairs; items must be sorted by name.
func itemsVersion(items []item) string {
	d := xxhash.New()
	var buf [8]byte
	for _, it := range items {
		_, _ = d.WriteString(it.name)
		_, _ = d.Write([]byte{0})
		binary.BigEndian.PutUint64(buf[:], it.sum)
		_, _ = d.Write(buf[:])
	}
	return strconv.FormatUint(d.Sum64(), 16)
}

// newSnapshot assembles a snapshot from sorted items, one version per type.
func newSnapshot(m map[resource.Type][]item) *cache.Snapshot {
	s := &cache.Snapshot{}
	for typ, items := range m {
		byName := make(map[string]types.ResourceWithTTL, len(items))
		for _, it := range items {
			byName[it.name] = types.ResourceWithTTL{Resource: it.res}
		}
		s.Resources[cache.GetResponseType(typ)] = cache.Resources{Version: itemsVersion(items), Items: byName}
	}
	return s
}
