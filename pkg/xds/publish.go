package xds

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds/edscache"
)

// publisher turns registry snapshots into what the caches serve: it rebuilds, per snapshot
// key, the resources Resources defines for the key's Profile (reusing each service's build
// while the service is unchanged), diffs them against what it published, checks the complete
// snapshots, and pushes in an order Envoy can follow. It owns the caches' content; the Server
// owns the gRPC side. Safe for concurrent use (publish is serialized).
type publisher struct {
	check         func(*cache.Snapshot) error
	sotw          *sotwCache          // every state-of-the-world stream
	snapshots     cache.SnapshotCache // delta streams of Envoy nodes (ads=true)
	grpcSnapshots cache.SnapshotCache // delta streams of gRPC nodes (ads=false)
	endpoints     *edscache.Cache

	mu         sync.Mutex // serializes publish and guards the fields below
	profiles   []*profile // sorted by key
	eds        map[string]edsEntry
	services   []registry.Service // the services of the last published snapshots
	servicesOK bool
	lastErr    error
	pubGen     uint64
	pubCount   uint64
}

// edsEntry is the published CLA of one service, the instances it was built from and the salt
// of its version (clusterSalt).
type edsEntry struct {
	instances []registry.Instance
	it        item
	res       *edscache.Resource
	salt      uint64
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

// publish rebuilds everything from snap and publishes what changed: new CLAs and changed CLAs
// of unchanged clusters first (so a new cluster finds its endpoints), then the snapshots, then
// CLAs of clusters whose definition changed (Envoy re-warms such a cluster and waits for an EDS
// response; the CLA's version covers its clusters, see clusterSalt), and deletions last.
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

	var builds []*profileBuild
	if servicesChanged {
		if builds, err = s.buildProfiles(services); err != nil {
			return err
		}
	}
	ep, err := s.endpointChanges(snap, services, builds, servicesChanged)
	if err != nil {
		return err
	}
	if !servicesChanged && len(ep.early)+len(ep.late) == 0 {
		s.eds = ep.eds
		s.pubGen = snap.Generation
		return nil
	}
	snaps, err := s.checkedSnapshots(services, ep.eds, builds, servicesChanged)
	if err != nil {
		return err
	}

	// Everything built and checked: publish.
	s.endpoints.Update(ep.early, nil)
	if err := s.setSnapshots(ctx, builds, snaps); err != nil {
		return err
	}
	s.endpoints.Update(ep.late, nil)
	s.endpoints.Update(nil, ep.removed)
	if len(ep.early)+len(ep.late)+len(ep.removed) > 0 {
		s.pubCount++
	}
	s.eds = ep.eds
	if servicesChanged {
		s.services, s.servicesOK = services, true
	}
	s.pubGen = snap.Generation
	return nil
}

// buildProfiles builds every profile's next resources for services.
func (s *publisher) buildProfiles(services []registry.Service) ([]*profileBuild, error) {
	builds := make([]*profileBuild, 0, len(s.profiles))
	for _, p := range s.profiles {
		b, err := p.build(services)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", p.key, err)
		}
		builds = append(builds, b)
	}
	return builds, nil
}

// endpointDiff is the next published CLAs and what to push, in publish's order.
type endpointDiff struct {
	eds     map[string]edsEntry
	early   []*edscache.Resource // new services, and changed endpoints of unchanged clusters
	late    []*edscache.Resource // endpoints of changed clusters, after the clusters
	removed []string             // sorted
}

// endpointChanges rebuilds the CLA of every service whose instances or clusters changed (the
// clusters' salt is recomputed only when services changed) and sorts the changes into publish's
// order.
func (s *publisher) endpointChanges(snap *registry.Snapshot, services []registry.Service, builds []*profileBuild, servicesChanged bool) (endpointDiff, error) {
	d := endpointDiff{eds: make(map[string]edsEntry, len(services))}
	for _, svc := range services {
		ins := snap.Instances(svc.Name)
		old, ok := s.eds[svc.Name]
		salt := old.salt
		if servicesChanged || !ok {
			salt = clusterSalt(builds, svc.Name)
		}
		if ok && salt == old.salt && slices.Equal(old.instances, ins) {
			d.eds[svc.Name] = old
			continue
		}
		cla := ClusterLoadAssignment(svc.Name, ins)
		res, sum, err := edscache.NewResource(svc.Name, cla, salt)
		if err != nil {
			return endpointDiff{}, err
		}
		e := edsEntry{instances: ins, it: item{name: svc.Name, res: cla, sum: sum}, res: res, salt: salt}
		switch {
		case ok && old.res.Version() == res.Version(): // same content: keep the published resource
			e.it, e.res = old.it, old.res
		case ok && salt != old.salt:
			d.late = append(d.late, res)
		default:
			d.early = append(d.early, res)
		}
		d.eds[svc.Name] = e
	}
	for name := range s.eds {
		if _, ok := d.eds[name]; !ok {
			d.removed = append(d.removed, name)
		}
	}
	slices.Sort(d.removed)
	return d, nil
}

// checkedSnapshots checks every profile's complete snapshot (Consistent, then the check hook)
// when services changed or a hook is set, and returns, when services changed, each build's
// snapshot to publish (without endpoints), in build order.
func (s *publisher) checkedSnapshots(services []registry.Service, eds map[string]edsEntry, builds []*profileBuild, servicesChanged bool) ([]*cache.Snapshot, error) {
	if !servicesChanged && s.check == nil {
		return nil, nil
	}
	edsItems := make([]item, 0, len(eds))
	for _, svc := range services {
		edsItems = append(edsItems, eds[svc.Name].it)
	}
	slices.SortFunc(edsItems, func(x, y item) int { return cmp.Compare(x.name, y.name) })
	var snaps []*cache.Snapshot
	for i, p := range s.profiles {
		res := p.res
		if servicesChanged {
			res = builds[i].res
		}
		full := map[resource.Type][]item{resource.EndpointType: edsItems}
		for typ, list := range res {
			full[typ] = list
		}
		fullSnap := newSnapshot(full)
		if err := fullSnap.Consistent(); err != nil {
			return nil, fmt.Errorf("snapshot %s: inconsistent: %w", p.key, err)
		}
		if s.check != nil {
			if err := s.check(fullSnap); err != nil {
				return nil, fmt.Errorf("snapshot %s: %w", p.key, err)
			}
		}
		if servicesChanged {
			snaps = append(snaps, newSnapshot(res))
		}
	}
	return snaps, nil
}

// setSnapshots publishes each build whose versions changed, to the state-of-the-world cache
// and to the delta SnapshotCache of its kind, and commits every build.
func (s *publisher) setSnapshots(ctx context.Context, builds []*profileBuild, snaps []*cache.Snapshot) error {
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
			sotw := make(map[resource.Type]*sotwResources, 3)
			for typ, items := range b.res {
				sotw[typ] = newSOTWResources(typ, items, snaps[i].GetVersion(typ))
			}
			s.sotw.set(p.key, sotw)
			p.versions, p.published = versions, true
			s.pubCount++
		}
		b.commit()
	}
	return nil
}

// clusterSalt is the hash of every profile's cluster for a service, in profile order: part of
// the version of the service's CLA, so that the CLA is sent again (at a new version) whenever a
// cluster using it changes, since Envoy re-warms a changed cluster and waits for its endpoints.
// It depends only on the configuration, like every version tether serves.
func clusterSalt(builds []*profileBuild, service string) uint64 {
	d := xxhash.New()
	var buf [8]byte
	for _, b := range builds {
		_, _ = d.WriteString(b.p.key)
		_, _ = d.Write([]byte{0})
		binary.BigEndian.PutUint64(buf[:], b.perService[service].cluster().sum)
		_, _ = d.Write(buf[:])
	}
	return d.Sum64()
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
