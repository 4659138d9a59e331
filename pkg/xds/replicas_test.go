package xds_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// sotwTypes are the types an Envoy-like ADS client subscribes to, in Envoy's order.
var sotwTypes = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

// held is what an xDS client holds of one type: the resources and, for state of the world, the
// version_info it acknowledged last; for delta, each resource's version and the last
// system_version_info.
type held struct {
	Version   string
	Resources map[string]proto.Message
	Versions  map[string]string // delta only
}

// envoyADS is a raw state-of-the-world ADS stream that subscribes the way Envoy does: CDS and
// LDS by wildcard, EDS by the names of the clusters it holds, RDS by the route tables its
// listeners name; it ACKs every response with the version_info, nonce and names Envoy would
// send. It can start from what another stream held (failover to another replica): it then sends,
// for each type, the version it holds and the names it subscribes to, with no nonce.
type envoyADS struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient

	mu      sync.Mutex
	state   map[string]*held
	names   map[string][]string // current subscription per named type
	log     []*discoveryv3.DiscoveryResponse
	changed chan struct{}
	err     error
}

func openEnvoyADS(t *testing.T, ctx context.Context, conn grpc.ClientConnInterface, node *corev3.Node, from map[string]*held) *envoyADS {
	t.Helper()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &envoyADS{t: t, stream: s, state: map[string]*held{}, names: map[string][]string{}, changed: make(chan struct{})}
	for _, typ := range sotwTypes {
		c.state[typ] = &held{Resources: map[string]proto.Message{}}
		if h, ok := from[typ]; ok {
			c.state[typ] = &held{Version: h.Version, Resources: maps.Clone(h.Resources)}
		}
	}
	c.names[resource.EndpointType] = slices.Sorted(maps.Keys(c.state[resource.ClusterType].Resources))
	c.names[resource.RouteType] = routeNames(c.state[resource.ListenerType].Resources)
	// Starting from another stream's state, the named types go first: the answer to the CDS
	// request that follows them tells the caller the server has seen them (one stream's requests
	// are handled in order).
	order := sotwTypes
	if from != nil {
		order = []string{resource.EndpointType, resource.RouteType, resource.ClusterType, resource.ListenerType}
	}
	first := true
	for _, typ := range order {
		names, named := c.names[typ]
		if named && len(names) == 0 {
			continue
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: typ, VersionInfo: c.state[typ].Version, ResourceNames: names}
		if first {
			req.Node, first = node, false
		}
		c.send(req)
	}
	go c.loop()
	return c
}

func (c *envoyADS) send(req *discoveryv3.DiscoveryRequest) {
	if err := c.stream.Send(req); err != nil {
		c.fail(err)
	}
}

func (c *envoyADS) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *envoyADS) loop() {
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.fail(err)
			return
		}
		typ := resp.GetTypeUrl()
		got := map[string]proto.Message{}
		for _, a := range resp.GetResources() {
			m, err := a.UnmarshalNew()
			if err != nil {
				c.fail(err)
				return
			}
			got[cache.GetResourceName(m)] = m
		}
		c.mu.Lock()
		h := c.state[typ]
		if typ == resource.ClusterType || typ == resource.ListenerType {
			h.Resources = got // full state
		} else {
			maps.Copy(h.Resources, got)
		}
		h.Version = resp.GetVersionInfo()
		c.log = append(c.log, resp)
		var follow []*discoveryv3.DiscoveryRequest
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: typ, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: c.names[typ]}
		for dep, names := range map[string][]string{
			resource.EndpointType: slices.Sorted(maps.Keys(c.state[resource.ClusterType].Resources)),
			resource.RouteType:    routeNames(c.state[resource.ListenerType].Resources),
		} {
			if (typ == resource.ClusterType && dep == resource.EndpointType) || (typ == resource.ListenerType && dep == resource.RouteType) {
				if !slices.Equal(names, c.names[dep]) {
					c.names[dep] = names
					follow = append(follow, &discoveryv3.DiscoveryRequest{TypeUrl: dep, VersionInfo: c.state[dep].Version, ResourceNames: names})
					// Like Envoy, drop what belonged to a cluster or listener that is gone.
					maps.DeleteFunc(c.state[dep].Resources, func(name string, _ proto.Message) bool { return !slices.Contains(names, name) })
				}
			}
		}
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		c.send(ack)
		for _, r := range follow {
			c.send(r)
		}
	}
}

// routeNames lists the RDS route tables the listeners' connection managers name.
func routeNames(listeners map[string]proto.Message) []string {
	var out []string
	for _, m := range listeners {
		l, _ := m.(*listenerv3.Listener)
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) == nil && hcm.GetRds() != nil {
					out = append(out, hcm.GetRds().GetRouteConfigName())
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// wait blocks until cond holds for the held state (read under the client's lock).
func (c *envoyADS) wait(ctx context.Context, what string, cond func(map[string]*held) bool) {
	c.t.Helper()
	for {
		c.mu.Lock()
		ok, err, ch := cond(c.state), c.err, c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		if err != nil {
			c.t.Fatalf("%s: stream failed: %v", what, err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			c.t.Fatalf("%s: %v", what, ctx.Err())
		}
	}
}

// answered reports whether a response of typ arrived; call it inside wait (under the lock).
func (c *envoyADS) answered(typ string) bool {
	return slices.ContainsFunc(c.log, func(r *discoveryv3.DiscoveryResponse) bool { return r.GetTypeUrl() == typ })
}

// snapshot copies what the client holds, and the responses it received so far.
func (c *envoyADS) snapshot() (map[string]*held, []*discoveryv3.DiscoveryResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*held{}
	for typ, h := range c.state {
		out[typ] = &held{Version: h.Version, Resources: maps.Clone(h.Resources)}
	}
	return out, slices.Clone(c.log)
}

// deltaADS is a raw delta ADS stream subscribed to CDS (wildcard) and to EDS by the names of the
// clusters it holds, ACKing every response; it can start from another stream's versions
// (initial_resource_versions), as Envoy does when it reconnects.
type deltaADS struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient

	mu      sync.Mutex
	state   map[string]*held
	log     []*discoveryv3.DeltaDiscoveryResponse
	edsSub  bool
	changed chan struct{}
	err     error
}

func openDeltaADS(t *testing.T, ctx context.Context, conn grpc.ClientConnInterface, node *corev3.Node, from map[string]*held) *deltaADS {
	t.Helper()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := &deltaADS{t: t, stream: s, state: map[string]*held{}, changed: make(chan struct{})}
	for _, typ := range []string{resource.ClusterType, resource.EndpointType} {
		d.state[typ] = &held{Resources: map[string]proto.Message{}, Versions: map[string]string{}}
		if h, ok := from[typ]; ok {
			d.state[typ] = &held{Version: h.Version, Resources: maps.Clone(h.Resources), Versions: maps.Clone(h.Versions)}
		}
	}
	// From another stream's state, EDS goes first: the answer to the first wildcard CDS request
	// (always sent, even when empty) then tells the caller the server has seen it.
	if names := slices.Sorted(maps.Keys(d.state[resource.ClusterType].Resources)); len(names) > 0 {
		d.edsSub = true
		d.send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNamesSubscribe: names, InitialResourceVersions: d.state[resource.EndpointType].Versions})
	}
	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, InitialResourceVersions: d.state[resource.ClusterType].Versions})
	go d.loop()
	return d
}

func (d *deltaADS) send(req *discoveryv3.DeltaDiscoveryRequest) {
	if err := d.stream.Send(req); err != nil {
		d.mu.Lock()
		d.err = err
		d.mu.Unlock()
	}
}

func (d *deltaADS) loop() {
	for {
		resp, err := d.stream.Recv()
		d.mu.Lock()
		if err != nil {
			d.err = err
			close(d.changed)
			d.mu.Unlock()
			return
		}
		typ := resp.GetTypeUrl()
		h := d.state[typ]
		for _, r := range resp.GetResources() {
			m, err := r.GetResource().UnmarshalNew()
			if err != nil {
				d.err = err
				break
			}
			h.Resources[r.GetName()] = m
			h.Versions[r.GetName()] = r.GetVersion()
		}
		for _, name := range resp.GetRemovedResources() {
			delete(h.Resources, name)
			delete(h.Versions, name)
		}
		h.Version = resp.GetSystemVersionInfo()
		d.log = append(d.log, resp)
		var sub []string
		if typ == resource.ClusterType && !d.edsSub && len(h.Resources) > 0 {
			d.edsSub = true
			sub = slices.Sorted(maps.Keys(h.Resources))
		}
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
		d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.GetNonce()})
		if sub != nil {
			d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: sub})
		}
	}
}

func (d *deltaADS) wait(ctx context.Context, what string, cond func(map[string]*held) bool) {
	d.t.Helper()
	for {
		d.mu.Lock()
		ok, err, ch := cond(d.state), d.err, d.changed
		d.mu.Unlock()
		if ok {
			return
		}
		if err != nil {
			d.t.Fatalf("%s: delta stream failed: %v", what, err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			d.t.Fatalf("%s: %v", what, ctx.Err())
		}
	}
}

// answered reports whether a response of typ arrived; call it inside wait (under the lock).
func (d *deltaADS) answered(typ string) bool {
	return slices.ContainsFunc(d.log, func(r *discoveryv3.DeltaDiscoveryResponse) bool { return r.GetTypeUrl() == typ })
}

func (d *deltaADS) snapshot() (map[string]*held, []*discoveryv3.DeltaDiscoveryResponse) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]*held{}
	for typ, h := range d.state {
		out[typ] = &held{Version: h.Version, Resources: maps.Clone(h.Resources), Versions: maps.Clone(h.Versions)}
	}
	return out, slices.Clone(d.log)
}

// sameHeld reports whether two clients hold the same: cheaper than cmp.Diff, which explains a
// difference.
func sameHeld(a, b map[string]*held) bool {
	if len(a) != len(b) {
		return false
	}
	for typ, x := range a {
		y, ok := b[typ]
		if !ok || x.Version != y.Version || !maps.Equal(x.Versions, y.Versions) || !sameResources(x.Resources, y.Resources) {
			return false
		}
	}
	return true
}

// holdsAll reports whether a client holds exactly what xds.Resources builds for its profile.
func holdsAll(want *xds.ResourceSet) func(map[string]*held) bool {
	return func(st map[string]*held) bool {
		for typ, h := range st {
			exp := byName(want, typ)
			if typ == resource.RouteType && len(exp) == 0 {
				continue
			}
			if !sameResources(exp, h.Resources) {
				return false
			}
		}
		return true
	}
}

// TestReplicasServeIdenticalXDS (#12): three independent Servers, each on its own registry, are
// brought to the same registry state by different histories (all at once; instances one at a
// time in another order with a service and health flips on the way; an extra service and
// changed weights that are then undone). Real xDS clients of each kind of node — Envoy-like SotW
// ADS streams (CDS/LDS wildcard, EDS/RDS by name) and delta ADS streams — receive from every
// replica the same resources, the same version_info and the same per-resource versions. A
// client that moves to another replica with what it acknowledged gets nothing it did not
// already have: the snapshot types answer with identical content at the identical version, EDS
// does not answer until something changes, and then with that change alone.
func TestReplicasServeIdenticalXDS(t *testing.T) {
	gw := xds.Params{ManagedListeners: true, ListenerAddress: "127.0.0.1:10080"}
	docs := registry.Service{Name: "docs", Affinity: registry.AffinityHeader, HeaderField: "x-doc", Match: registry.Match{PathPrefix: "/docs"}}
	docs1 := registry.Instance{Service: "docs", ID: "docs-1", Address: "::1", HTTPPort: 8100, Weight: 2, State: registry.StateActive}
	services := append(baseServices(), docs)
	instances := append(baseInstances(), docs1)
	unhealthy := registry.Key{Service: "web", ID: "web-2"}
	setHealth := func(reg *registry.Registry, k registry.Key, h registry.Health) {
		t.Helper()
		if _, err := reg.SetHealth(k, h); err != nil {
			t.Fatal(err)
		}
	}

	// a: the final state at once.
	a := start(t, services, instances, xds.WithNodeParams("gateway", gw))
	setHealth(a.reg, unhealthy, registry.HealthUnhealthy)

	// b: starts with one service; the rest arrives instance by instance, in reverse order,
	// through a service that is later removed and a health flip.
	b := start(t, services[:1], nil, xds.WithNodeParams("gateway", gw))
	extra := registry.Service{Name: "extra", Match: registry.Match{PathPrefix: "/extra"}}
	if err := b.reg.Apply(append(slices.Clone(services), extra), nil); err != nil {
		t.Fatal(err)
	}
	for _, in := range slices.Backward(instances) {
		if err := b.reg.Register(in); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.reg.Register(registry.Instance{Service: "extra", ID: "x-1", Address: "127.0.0.9", HTTPPort: 9999}); err != nil {
		t.Fatal(err)
	}
	setHealth(b.reg, registry.Key{Service: "web", ID: "web-1"}, registry.HealthUnhealthy)
	setHealth(b.reg, unhealthy, registry.HealthUnhealthy)
	setHealth(b.reg, registry.Key{Service: "web", ID: "web-1"}, registry.HealthUnknown)
	if err := b.reg.Apply(services, instances); err != nil {
		t.Fatal(err)
	}
	setHealth(b.reg, unhealthy, registry.HealthUnhealthy)

	// c: an extra service and other weights first, then undone.
	heavy := slices.Clone(instances)
	for i := range heavy {
		heavy[i].Weight = 7
	}
	c := start(t, append(slices.Clone(services), extra), heavy, xds.WithNodeParams("gateway", gw))
	setHealth(c.reg, unhealthy, registry.HealthUnhealthy)
	if err := c.reg.Apply(services, instances); err != nil {
		t.Fatal(err)
	}
	setHealth(c.reg, unhealthy, registry.HealthUnhealthy)

	replicas := map[string]*fixture{"a": a, "b": b, "c": c}
	for _, f := range replicas {
		gen := f.reg.Snapshot().Generation
		testutil.Eventually(t, "the replica to publish the last generation", func() bool { return f.srv.Stats().Generation == gen })
	}
	grpcMeta, err := structpb.NewStruct(map[string]any{xds.ProfileMetadataKey: "grpc"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*corev3.Node{
		{Id: "sidecar", UserAgentName: "envoy"},
		{Id: "gateway", UserAgentName: "envoy"},
		{Id: "grpc", UserAgentName: "envoy", Metadata: grpcMeta},
	}
	// A generous bound: three servers validate every snapshot they publish, under -race.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)

	// Precondition: the three registries hold the same state (what Resources builds from it).
	for _, n := range nodes {
		want, err := xds.Resources(a.srv.NodeProfile(n), a.reg.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range replicas {
			got, err := xds.Resources(f.srv.NodeProfile(n), f.reg.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
				t.Fatalf("registry state of %s differs from a's (-a +%s):\n%s", name, name, d)
			}
		}
	}

	type clients struct {
		sotw  *envoyADS
		delta *deltaADS
	}
	served := map[string]map[string]clients{} // replica → node → clients
	for name, f := range replicas {
		served[name] = map[string]clients{}
		for _, n := range nodes {
			want, err := xds.Resources(f.srv.NodeProfile(n), f.reg.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			cl := clients{sotw: openEnvoyADS(t, ctx, f.conn, n, nil), delta: openDeltaADS(t, ctx, f.conn, n, nil)}
			cl.sotw.wait(ctx, name+"/"+n.GetId()+" sotw in sync", holdsAll(want))
			cl.delta.wait(ctx, name+"/"+n.GetId()+" delta in sync", func(st map[string]*held) bool {
				return sameResources(byName(want, resource.ClusterType), st[resource.ClusterType].Resources) &&
					sameResources(byName(want, resource.EndpointType), st[resource.EndpointType].Resources)
			})
			served[name][n.GetId()] = cl
		}
	}

	t.Run("same resources and versions from every replica", func(t *testing.T) {
		for _, n := range nodes {
			wantSotw, _ := served["a"][n.GetId()].sotw.snapshot()
			wantDelta, _ := served["a"][n.GetId()].delta.snapshot()
			for _, name := range []string{"b", "c"} {
				gotSotw, _ := served[name][n.GetId()].sotw.snapshot()
				if !sameHeld(wantSotw, gotSotw) {
					t.Errorf("node %s: SotW from %s differs from a (-a +%s):\n%s", n.GetId(), name, name, cmp.Diff(wantSotw, gotSotw, protocmp.Transform()))
				}
				gotDelta, _ := served[name][n.GetId()].delta.snapshot()
				if !sameHeld(wantDelta, gotDelta) {
					t.Errorf("node %s: delta from %s differs from a (-a +%s):\n%s", n.GetId(), name, name, cmp.Diff(wantDelta, gotDelta, protocmp.Transform()))
				}
			}
			for typ, h := range wantSotw {
				if len(h.Resources) > 0 && h.Version == "" {
					t.Errorf("node %s: %s without a version_info", n.GetId(), typ)
				}
			}
			for typ, h := range wantDelta {
				if len(h.Versions) != len(h.Resources) || slices.Contains(slices.Collect(maps.Values(h.Versions)), "") {
					t.Errorf("node %s: delta %s versions %v", n.GetId(), typ, h.Versions)
				}
			}
		}
	})

	t.Run("failover to another replica brings nothing new", func(t *testing.T) {
		// Each client of a moves to b (the sidecar and the gRPC node) or c (the gateway) with what
		// it acknowledged; then one instance changes on every replica.
		move := map[string]string{"sidecar": "b", "gateway": "c", "grpc": "b"}
		type moved struct {
			sotw         *envoyADS
			delta        *deltaADS
			sotwBefore   map[string]*held
			deltaBefore  map[string]*held
			target, node string
		}
		var all []moved
		for _, n := range nodes {
			from := served["a"][n.GetId()]
			sb, _ := from.sotw.snapshot()
			db, _ := from.delta.snapshot()
			to := replicas[move[n.GetId()]]
			m := moved{sotwBefore: sb, deltaBefore: db, target: move[n.GetId()], node: n.GetId()}
			m.sotw = openEnvoyADS(t, ctx, to.conn, n, sb)
			m.delta = openDeltaADS(t, ctx, to.conn, n, db)
			all = append(all, m)
		}
		// Once each moved stream has its CDS answer, the server has its EDS request too (sent
		// first). Whatever arrives before the change must be what the client already holds.
		for _, m := range all {
			m.sotw.wait(ctx, m.node+" moved (sotw): CDS answer", func(map[string]*held) bool { return m.sotw.answered(resource.ClusterType) })
			m.delta.wait(ctx, m.node+" moved (delta): CDS answer", func(map[string]*held) bool { return m.delta.answered(resource.ClusterType) })
		}
		changedKey := registry.Key{Service: "api", ID: "api-1"}
		for _, f := range replicas {
			setHealth(f.reg, changedKey, registry.HealthUnhealthy)
		}
		for _, m := range all {
			f := replicas[m.target]
			want, err := xds.Resources(f.srv.NodeProfile(&corev3.Node{Id: m.node, Metadata: nodes[slices.IndexFunc(nodes, func(n *corev3.Node) bool { return n.GetId() == m.node })].GetMetadata()}), f.reg.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			newAPI := byName(want, resource.EndpointType)["api"]
			hasNew := func(st map[string]*held) bool { return proto.Equal(st[resource.EndpointType].Resources["api"], newAPI) }
			m.sotw.wait(ctx, m.node+" moved (sotw): the change", hasNew)
			m.delta.wait(ctx, m.node+" moved (delta): the change", hasNew)

			_, log := m.sotw.snapshot()
			for _, r := range log {
				got := map[string]proto.Message{}
				for _, a := range r.GetResources() {
					msg, err := a.UnmarshalNew()
					if err != nil {
						t.Fatal(err)
					}
					got[cache.GetResourceName(msg)] = msg
				}
				if r.GetTypeUrl() == resource.EndpointType {
					if d := cmp.Diff(map[string]proto.Message{"api": newAPI}, got, protocmp.Transform()); d != "" {
						t.Errorf("%s moved to %s: EDS response %s carried more than the change (-want +got):\n%s", m.node, m.target, r.GetVersionInfo(), d)
					}
					continue
				}
				before := m.sotwBefore[r.GetTypeUrl()]
				if r.GetVersionInfo() != before.Version {
					t.Errorf("%s moved to %s: %s version_info %q, held %q", m.node, m.target, r.GetTypeUrl(), r.GetVersionInfo(), before.Version)
				}
				if d := cmp.Diff(before.Resources, got, protocmp.Transform()); d != "" {
					t.Errorf("%s moved to %s: %s differs from what it held (-held +got):\n%s", m.node, m.target, r.GetTypeUrl(), d)
				}
			}
			_, dlog := m.delta.snapshot()
			for _, r := range dlog {
				for _, res := range r.GetResources() {
					if r.GetTypeUrl() == resource.EndpointType && res.GetName() == "api" {
						continue
					}
					if v := m.deltaBefore[r.GetTypeUrl()].Versions[res.GetName()]; v != res.GetVersion() {
						t.Errorf("%s moved to %s: delta %s %s at version %q, held %q", m.node, m.target, r.GetTypeUrl(), res.GetName(), res.GetVersion(), v)
					}
				}
				if len(r.GetRemovedResources()) > 0 {
					t.Errorf("%s moved to %s: delta %s removed %v", m.node, m.target, r.GetTypeUrl(), r.GetRemovedResources())
				}
			}
			// After the change, the moved client and a client that stayed on its replica agree.
			stayed := served[m.target][m.node]
			stayed.sotw.wait(ctx, m.node+" stayed: the change", hasNew)
			got, _ := m.sotw.snapshot()
			exp, _ := stayed.sotw.snapshot()
			if !sameHeld(exp, got) {
				t.Errorf("%s moved to %s: holds other than a client of %s (-stayed +moved):\n%s", m.node, m.target, m.target, cmp.Diff(exp, got, protocmp.Transform()))
			}
		}
	})
}
