package xds

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/tether-dev/tether/pkg/registry"
)

// publisher turns registry snapshots into what the caches serve: it rebuilds, per snapshot
// key, the resources Resources defines for the key's Profile (reusing each service's build
// while the service is unchanged), diffs them against what it published, checks the complete
// snapshots, and pushes in an order Envoy can follow. It owns the caches' content; the Server
// owns the gRPC side. Safe for concurrent use (publish is serialized).
type publisher struct {
	check         func(*cache.Snapshot) error
	snapshots     cache.SnapshotCache // Envoy nodes (ads=true)
	grpcSnapshots cache.SnapshotCache // gRPC nodes (ads=false)
	endpoints     *cache.LinearCache

	mu         sync.Mutex // serializes publish and guards the fields below
	profiles   []*profile // sorted by key
	eds        map[string]edsEntry
	services   []registry.Service // the services of the last published snapshots
	servicesOK bool
	lastErr    error
	pubGen     uint64
	pubCount   uint64
}

// edsEntry is the published CLA of one service and the instances it was built from.
type edsEntry struct {
	instances []registry.Instance
	it        item
}

// profile is one snapshot key's builder state.
type profile struct {
	key string
	pr  Profile

	perService map[string]serviceBuild // by service name
	shared     []item                  // sharedResources, hashed
	sharedFor  []registry.Service      // the services shared was built from
	sharedOK   bool
	res        map[resource.Type][]item  // published resources (without endpoints)
	versions   [types.UnknownType]string // published versions
	published  bool
}

type serviceBuild struct {
	svc   registry.Service
	items []item
	typs  []resource.Type
}

func (sb serviceBuild) cluster() item {
	for i, t := range sb.typs {
		if t == resource.ClusterType {
			return sb.items[i]
		}
	}
	return item{}
}

// profileBuild is a profile's next state, committed only when the whole publish succeeds.
type profileBuild struct {
	p          *profile
	services   []registry.Service
	perService map[string]serviceBuild
	shared     []item
	res        map[resource.Type][]item // without endpoints
	changed    []string                 // services whose cluster changed (not new)
}

func (p *profile) build(services []registry.Service) (*profileBuild, error) {
	b := &profileBuild{p: p, services: services, perService: make(map[string]serviceBuild, len(services)), res: map[resource.Type][]item{}}
	for _, svc := range services {
		old, ok := p.perService[svc.Name]
		if ok && reflect.DeepEqual(old.svc, svc) {
			b.perService[svc.Name] = old
			continue
		}
		msgs, err := serviceResources(p.pr, svc)
		if err != nil {
			return nil, err
		}
		sb := serviceBuild{svc: svc}
		for _, m := range msgs {
			it, err := newItem(m)
			if err != nil {
				return nil, err
			}
			sb.items, sb.typs = append(sb.items, it), append(sb.typs, typeOf(m))
		}
		if ok && old.cluster().sum != sb.cluster().sum {
			b.changed = append(b.changed, svc.Name)
		}
		b.perService[svc.Name] = sb
	}
	for _, svc := range services {
		sb := b.perService[svc.Name]
		for i, it := range sb.items {
			b.res[sb.typs[i]] = append(b.res[sb.typs[i]], it)
		}
	}
	b.shared = p.shared
	if p.pr.hasShared() && (!p.sharedOK || !reflect.DeepEqual(p.sharedFor, services)) {
		msgs, err := sharedResources(p.pr, services)
		if err != nil {
			return nil, err
		}
		b.shared = nil
		for _, m := range msgs {
			it, err := newItem(m)
			if err != nil {
				return nil, err
			}
			b.shared = append(b.shared, it)
		}
	}
	if p.pr.hasShared() {
		for _, it := range b.shared {
			typ := typeOf(it.res)
			b.res[typ] = append(b.res[typ], it)
		}
	}
	for _, typ := range []resource.Type{resource.ClusterType, resource.ListenerType, resource.RouteType} {
		slices.SortFunc(b.res[typ], func(x, y item) int { return cmp.Compare(x.name, y.name) })
		if b.res[typ] == nil {
			b.res[typ] = []item{}
		}
	}
	return b, nil
}

func (b *profileBuild) commit() {
	b.p.perService = b.perService
	b.p.res = b.res
	if b.p.pr.hasShared() {
		b.p.shared = b.shared
		b.p.sharedFor = b.services
		b.p.sharedOK = true
	}
}

// publish rebuilds everything from snap and publishes what changed: new and changed CLAs
// first (so a new cluster finds its endpoints), then the snapshots, then CLAs of clusters
// whose definition changed (Envoy re-warms such a cluster and waits for an EDS response), and
// deletions last.
//
// When the services are unchanged (health, state and instance changes: the common case) the
// cluster, listener and route snapshots cannot change and neither can the reference graph
// Consistent() checks, since every service has exactly one cluster and one CLA of its name; only
// the changed CLAs are rebuilt and pushed. The snapshot check hook, when set, still sees every
// complete snapshot.
func (s *publisher) publish(ctx context.Context, snap *registry.Snapshot) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() { s.lastErr = err }()
	services := snap.Services()
	servicesChanged := !s.servicesOK || !sameServices(s.services, services)

	eds := make(map[string]edsEntry, len(services))
	changed := map[string]types.Resource{}
	for _, svc := range services {
		ins := snap.Instances(svc.Name)
		old, ok := s.eds[svc.Name]
		if ok && slices.Equal(old.instances, ins) {
			eds[svc.Name] = old
			continue
		}
		it, err := newItem(ClusterLoadAssignment(svc.Name, ins))
		if err != nil {
			return err
		}
		if ok && old.it.sum == it.sum {
			it = old.it // same content: keep the published proto
		} else {
			changed[svc.Name] = it.res
		}
		eds[svc.Name] = edsEntry{instances: ins, it: it}
	}
	var removed []string
	for name := range s.eds {
		if _, ok := eds[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(removed)
	if !servicesChanged && len(changed) == 0 {
		s.eds = eds
		s.pubGen = snap.Generation
		return nil
	}
	var edsItems []item
	if servicesChanged || s.check != nil {
		edsItems = make([]item, 0, len(eds))
		for _, svc := range services {
			edsItems = append(edsItems, eds[svc.Name].it)
		}
		slices.SortFunc(edsItems, func(x, y item) int { return cmp.Compare(x.name, y.name) })
	}

	var (
		builds []*profileBuild
		snaps  []*cache.Snapshot
	)
	for _, p := range s.profiles {
		var res map[resource.Type][]item
		if servicesChanged {
			b, err := p.build(services)
			if err != nil {
				return fmt.Errorf("snapshot %s: %w", p.key, err)
			}
			builds = append(builds, b)
			res = b.res
		} else if s.check != nil {
			res = p.res
		} else {
			continue
		}
		full := map[resource.Type][]item{resource.EndpointType: edsItems}
		for typ, list := range res {
			full[typ] = list
		}
		fullSnap := newSnapshot(full)
		if err := fullSnap.Consistent(); err != nil {
			return fmt.Errorf("snapshot %s: inconsistent: %w", p.key, err)
		}
		if s.check != nil {
			if err := s.check(fullSnap); err != nil {
				return fmt.Errorf("snapshot %s: %w", p.key, err)
			}
		}
		if servicesChanged {
			snaps = append(snaps, newSnapshot(res))
		}
	}

	// Everything built and checked: publish.
	if len(changed) > 0 {
		if err := s.endpoints.UpdateResources(changed, nil); err != nil {
			return fmt.Errorf("update endpoints: %w", err)
		}
	}
	repush := map[string]types.Resource{}
	for i, b := range builds {
		p := b.p
		var versions [types.UnknownType]string
		for j := range versions {
			versions[j] = snaps[i].Resources[j].Version
		}
		if !p.published || versions != p.versions {
			target := s.snapshots
			if p.pr.Kind == KindGRPC {
				target = s.grpcSnapshots
			}
			if err := target.SetSnapshot(ctx, p.key, snaps[i]); err != nil {
				return fmt.Errorf("set snapshot %s: %w", p.key, err)
			}
			p.versions, p.published = versions, true
			s.pubCount++
		}
		b.commit()
		for _, name := range b.changed {
			if _, done := changed[name]; !done {
				repush[name] = eds[name].it.res
			}
		}
	}
	if len(repush) > 0 {
		if err := s.endpoints.UpdateResources(repush, nil); err != nil {
			return fmt.Errorf("update endpoints: %w", err)
		}
	}
	if len(removed) > 0 {
		if err := s.endpoints.UpdateResources(nil, removed); err != nil {
			return fmt.Errorf("delete endpoints: %w", err)
		}
	}
	if len(changed)+len(repush)+len(removed) > 0 {
		s.pubCount++
	}
	s.eds = eds
	if servicesChanged {
		s.services, s.servicesOK = services, true
	}
	s.pubGen = snap.Generation
	return nil
}

func (s *publisher) stats() PublishStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return PublishStats{Generation: s.pubGen, Publishes: s.pubCount, LastError: s.lastErr}
}

// sameServices reports whether two registry service lists are equal. The registry reuses the
// slice when only instances change, which makes the common case a pointer comparison.
func sameServices(a, b []registry.Service) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return reflect.DeepEqual(a, b)
}
