package xds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	deltav3 "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/tether-dev/tether/pkg/registry"
)

// Snapshot keys. go-control-plane keys snapshots by the string its NodeHash returns for a
// node; tether's hash returns NodeSnapshotKeyPrefix+id for a node with its own parameters
// (WithNodeParams) and one of the two default keys otherwise, so an unknown node is served the
// default the moment it connects — no per-node bookkeeping, no window without a snapshot, and
// one SetSnapshot per key (not per node) when the registry changes.
const (
	DefaultEnvoySnapshot  = "default/envoy"
	DefaultGRPCSnapshot   = "default/grpc"
	NodeSnapshotKeyPrefix = "node/"
	// ProfileMetadataKey in a node's metadata ("envoy" or "grpc") chooses the default snapshot
	// explicitly. Without it, a node whose user_agent_name starts with "gRPC" (grpc-go reports
	// "gRPC Go") gets DefaultGRPCSnapshot and every other node DefaultEnvoySnapshot.
	ProfileMetadataKey = "tether.profile"
)

// DefaultDebounce is how long the server waits after a registry change before rebuilding, so
// a burst of changes (a config reload, a health-check sweep) becomes one push.
const DefaultDebounce = 50 * time.Millisecond

// Server is tether's ADS server. It follows the registry, rebuilds the xDS resources of every
// snapshot key, and serves them to Envoy and gRPC clients over state-of-the-world and delta
// ADS on one gRPC listener.
//
// Clusters, listeners and routes come from go-control-plane SnapshotCaches (for Envoy nodes
// with ads=true, so a response waits until all referenced resources are requested; for gRPC
// nodes, which subscribe by name, without); ClusterLoadAssignments come
// from one LinearCache shared by every node, behind a MuxCache, so one instance change sends one
// small EDS update instead of a new snapshot to every node. Versions are content hashes
// (ContentVersion per type; the LinearCache's counter moves only when a CLA's content changed),
// so an unchanged model never causes a push. Whenever clusters, listeners or routes are rebuilt,
// the complete snapshot passes Consistent() (and the WithSnapshotCheck hook) before anything is
// published; an endpoint-only change cannot alter what Consistent() checks and skips it (the hook
// still runs when set). A failing rebuild is logged and the previous configuration stays in
// place.
//
// All methods are safe for concurrent use. Run may be called once.
type Server struct {
	reg        *registry.Registry
	log        *slog.Logger
	params     Params
	nodeParams map[string]Params
	debounce   time.Duration
	check      func(*cache.Snapshot) error
	grpcOpts   []grpc.ServerOption

	snapshots     cache.SnapshotCache // Envoy nodes (ads=true)
	grpcSnapshots cache.SnapshotCache // gRPC nodes (ads=false)
	endpoints     *cache.LinearCache
	mux           *cache.MuxCache
	tracker       *tracker
	running       atomic.Bool

	mu         sync.Mutex // serializes publish and guards the fields below
	profiles   []*profile // sorted by key
	eds        map[string]edsEntry
	services   []registry.Service // the services of the last published snapshots
	servicesOK bool
	lastErr    error
	pubGen     uint64
	pubCount   uint64
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: discard). NACKs are logged at Warn, failed rebuilds at
// Error, go-control-plane's own messages at Debug.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithParams sets the builder parameters of the default Envoy snapshot (default: zero Params,
// i.e. every default).
func WithParams(p Params) Option { return func(s *Server) { s.params = p } }

// WithNodeParams gives the node with this id its own Envoy snapshot built with p (for example
// managed listeners on one gateway but not on another), whatever kind of client it is. Other
// nodes are unaffected.
func WithNodeParams(nodeID string, p Params) Option {
	return func(s *Server) { s.nodeParams[nodeID] = p }
}

// WithDebounce sets how long to wait after a registry change before rebuilding (default
// DefaultDebounce; 0 rebuilds on every generation). The wait starts at the first change of a
// burst and is not extended by later ones, so a continuous stream of changes still publishes
// at least once per d.
func WithDebounce(d time.Duration) Option { return func(s *Server) { s.debounce = d } }

// WithSnapshotCheck runs check on every complete snapshot (all types, endpoints included)
// before it is published; an error keeps the previous configuration. Typical use:
// pkg/envoyvalidate.ValidateSnapshot, so tether never pushes what Envoy would reject.
func WithSnapshotCheck(check func(*cache.Snapshot) error) Option {
	return func(s *Server) { s.check = check }
}

// WithGRPCServerOptions adds options to the gRPC server Run creates (after tether's keepalive
// defaults, so they can override them).
func WithGRPCServerOptions(opts ...grpc.ServerOption) Option {
	return func(s *Server) { s.grpcOpts = append(s.grpcOpts, opts...) }
}

// NewServer returns a server for reg. Nothing is built or served until Run.
func NewServer(reg *registry.Registry, opts ...Option) *Server {
	s := &Server{
		reg:        reg,
		log:        slog.New(slog.DiscardHandler),
		nodeParams: map[string]Params{},
		debounce:   DefaultDebounce,
		eds:        map[string]edsEntry{},
	}
	for _, o := range opts {
		o(s)
	}
	s.grpcOpts = append([]grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, s.grpcOpts...)

	lg := logAdapter(s.log)
	// Envoy subscribes to clusters and listeners by wildcard and to the one route table by name:
	// ads=true holds a response until everything it references is requested. gRPC clients
	// subscribe to single listeners and clusters by name, which ads=true would never answer
	// while the snapshot holds other names, so their snapshots live in a non-ADS cache.
	s.snapshots = cache.NewSnapshotCache(true, nodeHash(s.snapshotKey), lg)
	s.grpcSnapshots = cache.NewSnapshotCache(false, nodeHash(s.snapshotKey), lg)
	s.endpoints = cache.NewLinearCache(resource.EndpointType, cache.WithLogger(lg), cache.WithVersionPrefix("eds-"))
	s.mux = &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return s.classify(r.GetTypeUrl(), r.GetNode()) },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return s.classify(r.GetTypeUrl(), r.GetNode()) },
		Caches:        map[string]cache.Cache{"eds": s.endpoints, "envoy": s.snapshots, "grpc": s.grpcSnapshots},
	}
	s.tracker = newTracker(s.log, s.snapshotKey)

	s.profiles = append(s.profiles,
		&profile{key: DefaultEnvoySnapshot, params: s.params},
		&profile{key: DefaultGRPCSnapshot, grpc: true},
	)
	for id, p := range s.nodeParams {
		s.profiles = append(s.profiles, &profile{key: NodeSnapshotKeyPrefix + id, params: p})
	}
	slices.SortFunc(s.profiles, func(a, b *profile) int { return cmp.Compare(a.key, b.key) })
	return s
}

// classify routes a request to the cache serving it: endpoints for everyone from the linear
// cache, the rest from the snapshot cache of the node's kind.
func (s *Server) classify(typeURL string, n *corev3.Node) string {
	switch {
	case typeURL == resource.EndpointType:
		return "eds"
	case s.snapshotKey(n) == DefaultGRPCSnapshot:
		return "grpc"
	}
	return "envoy"
}

type nodeHash func(*corev3.Node) string

// ID implements go-control-plane's cache.NodeHash.
func (h nodeHash) ID(n *corev3.Node) string { return h(n) }

// snapshotKey is the snapshot a node is served; see DefaultEnvoySnapshot.
func (s *Server) snapshotKey(n *corev3.Node) string {
	if _, ok := s.nodeParams[n.GetId()]; ok {
		return NodeSnapshotKeyPrefix + n.GetId()
	}
	if v, ok := n.GetMetadata().GetFields()[ProfileMetadataKey]; ok {
		if v.GetStringValue() == "grpc" {
			return DefaultGRPCSnapshot
		}
		return DefaultEnvoySnapshot
	}
	if strings.HasPrefix(n.GetUserAgentName(), "gRPC") {
		return DefaultGRPCSnapshot
	}
	return DefaultEnvoySnapshot
}

// Run publishes the registry's current generation, then serves ADS on lis and follows the
// registry until ctx ends. It returns nil after a clean shutdown, or the error that stopped it
// (the initial build failing, or the listener failing). lis is closed when Run returns.
func (s *Server) Run(ctx context.Context, lis net.Listener) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("xds: Run called more than once")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates := s.reg.Watch(ctx)
	if err := s.publish(ctx, <-updates); err != nil {
		_ = lis.Close()
		return fmt.Errorf("xds: initial snapshot: %w", err)
	}

	lg := logAdapter(s.log)
	xdsServer := serverv3.NewServer(ctx, s.mux, s.tracker.callbacks(), sotwv3.WithLogger(lg), deltav3.WithLogger(lg))
	gs := grpc.NewServer(s.grpcOpts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, xdsServer)

	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(lis) }()
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		s.follow(ctx, updates)
	}()
	s.log.Info("xds: serving ADS", "addr", lis.Addr().String())

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("xds: serve: %w", err)
	}
	cancel()
	// Streams end on their own once ctx is done (go-control-plane watches the server context);
	// give them a moment, then cut the rest.
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		gs.Stop()
		<-stopped
	}
	<-followed
	return err
}

// follow publishes every registry generation, debounced.
func (s *Server) follow(ctx context.Context, updates <-chan *registry.Snapshot) {
	var (
		latest *registry.Snapshot
		timer  *time.Timer
		fire   <-chan time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case snap, ok := <-updates:
			if !ok {
				return
			}
			latest = snap
			if s.debounce <= 0 {
				s.publishLogged(ctx, latest)
				continue
			}
			if fire == nil {
				timer = time.NewTimer(s.debounce)
				fire = timer.C
			}
		case <-fire:
			fire = nil
			s.publishLogged(ctx, latest)
		}
	}
}

func (s *Server) publishLogged(ctx context.Context, snap *registry.Snapshot) {
	start := time.Now()
	if err := s.publish(ctx, snap); err != nil {
		s.log.Error("xds: rebuild failed; keeping the previous configuration", "generation", snap.Generation, "err", err)
		return
	}
	s.log.Debug("xds: published", "generation", snap.Generation, "took", time.Since(start))
}

// Status returns every known node (connected, or disconnected less than an hour ago), sorted by
// node id.
func (s *Server) Status() []NodeStatus { return s.tracker.snapshot() }

// StatusHandler serves Status as JSON ({"nodes": [...]}) on GET. It does no authentication:
// mount it behind the admin API's.
func (s *Server) StatusHandler() http.Handler { return statusHandler(s.Status) }

// PublishStats describes the last publish: the registry generation it reflects, how many
// rebuilds actually published something, and the last rebuild error (nil if it succeeded).
type PublishStats struct {
	Generation uint64
	Publishes  uint64
	LastError  error
}

// Stats returns the publishing counters.
func (s *Server) Stats() PublishStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return PublishStats{Generation: s.pubGen, Publishes: s.pubCount, LastError: s.lastErr}
}

// edsEntry is the published CLA of one service and the instances it was built from.
type edsEntry struct {
	instances []registry.Instance
	it        item
}

// profile is one snapshot key's builder state.
type profile struct {
	key    string
	grpc   bool
	params Params

	perService map[string]serviceBuild // by service name
	global     []item                  // managed listener and routes (Envoy profiles)
	globalFor  []registry.Service      // the services global was built from
	globalOK   bool
	res        map[resource.Type][]item  // published resources (without endpoints)
	versions   [types.UnknownType]string // published versions
	published  bool
}

type serviceBuild struct {
	svc   registry.Service
	items map[resource.Type]item
}

// profileBuild is a profile's next state, committed only when the whole publish succeeds.
type profileBuild struct {
	p          *profile
	services   []registry.Service
	perService map[string]serviceBuild
	global     []item
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
		sb, err := p.buildService(svc)
		if err != nil {
			return nil, err
		}
		if ok && old.items[resource.ClusterType].sum != sb.items[resource.ClusterType].sum {
			b.changed = append(b.changed, svc.Name)
		}
		b.perService[svc.Name] = sb
	}
	for _, svc := range services {
		for typ, it := range b.perService[svc.Name].items {
			b.res[typ] = append(b.res[typ], it)
		}
	}
	b.global = p.global
	if !p.grpc && p.params.ManagedListeners && (!p.globalOK || !reflect.DeepEqual(p.globalFor, services)) {
		l, err := Listener(p.params)
		if err != nil {
			return nil, err
		}
		r, err := RouteConfiguration(RouteConfigName, services)
		if err != nil {
			return nil, err
		}
		li, err := newItem(l)
		if err != nil {
			return nil, err
		}
		ri, err := newItem(r)
		if err != nil {
			return nil, err
		}
		b.global = []item{li, ri}
	}
	if !p.grpc && p.params.ManagedListeners {
		b.res[resource.ListenerType] = append(b.res[resource.ListenerType], b.global[0])
		b.res[resource.RouteType] = append(b.res[resource.RouteType], b.global[1])
	}
	for _, typ := range []resource.Type{resource.ClusterType, resource.ListenerType, resource.RouteType} {
		slices.SortFunc(b.res[typ], func(x, y item) int { return cmp.Compare(x.name, y.name) })
		if b.res[typ] == nil {
			b.res[typ] = []item{}
		}
	}
	return b, nil
}

func (p *profile) buildService(svc registry.Service) (serviceBuild, error) {
	sb := serviceBuild{svc: svc, items: map[resource.Type]item{}}
	if p.grpc {
		l, c, err := grpcService(svc)
		if err != nil {
			return sb, err
		}
		for typ, m := range map[resource.Type]types.Resource{resource.ListenerType: l, resource.ClusterType: c} {
			it, err := newItem(m)
			if err != nil {
				return sb, err
			}
			sb.items[typ] = it
		}
		return sb, nil
	}
	c, err := Cluster(svc, p.params)
	if err != nil {
		return sb, err
	}
	it, err := newItem(c)
	if err != nil {
		return sb, err
	}
	sb.items[resource.ClusterType] = it
	return sb, nil
}

func (b *profileBuild) commit() {
	b.p.perService = b.perService
	b.p.res = b.res
	if !b.p.grpc && b.p.params.ManagedListeners {
		b.p.global = b.global
		b.p.globalFor = b.services
		b.p.globalOK = true
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
func (s *Server) publish(ctx context.Context, snap *registry.Snapshot) (err error) {
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
			if p.grpc {
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

// logAdapter routes go-control-plane's logging into slog: its chatty Debug and Info at Debug.
// Messages are formatted only when the level is enabled.
func logAdapter(l *slog.Logger) gcplog.Logger {
	at := func(level slog.Level) func(string, ...any) {
		return func(f string, a ...any) {
			if l.Enabled(context.Background(), level) {
				l.Log(context.Background(), level, fmt.Sprintf(f, a...), "component", "go-control-plane")
			}
		}
	}
	return gcplog.LoggerFuncs{
		DebugFunc: at(slog.LevelDebug),
		InfoFunc:  at(slog.LevelDebug),
		WarnFunc:  at(slog.LevelWarn),
		ErrorFunc: at(slog.LevelError),
	}
}
