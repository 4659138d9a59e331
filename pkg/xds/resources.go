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

// ResourceSet is one complete set of xDS resources for one kind of client, every list sorted
// by resource name. A ResourceSet is a value the builders return; its protos must not be
// modified once it has been published.
type ResourceSet struct {
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
}

// Build builds the resources an Envoy node receives for a registry snapshot: a cluster and a
// ClusterLoadAssignment per service, and, when p.ManagedListeners, the data-plane Listener
// and its RouteConfiguration.
func Build(snap *registry.Snapshot, p Params) (*ResourceSet, error) {
	rs := &ResourceSet{}
	for _, svc := range snap.Services() {
		c, err := Cluster(svc, p)
		if err != nil {
			return nil, err
		}
		rs.Clusters = append(rs.Clusters, c)
		rs.Endpoints = append(rs.Endpoints, ClusterLoadAssignment(svc.Name, snap.Instances(svc.Name)))
	}
	if p.ManagedListeners {
		l, err := Listener(p)
		if err != nil {
			return nil, err
		}
		r, err := RouteConfiguration(RouteConfigName, snap.Services())
		if err != nil {
			return nil, err
		}
		rs.Listeners = []*listenerv3.Listener{l}
		rs.Routes = []*routev3.RouteConfiguration{r}
	}
	rs.sort()
	return rs, nil
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

// item is one built resource with its name and content hash.
type item struct {
	name string
	res  types.Resource
	sum  uint64
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
	return item{name: cache.GetResourceName(m), res: m, sum: xxhash.Sum64(b)}, nil
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
