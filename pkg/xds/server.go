package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
	deltav3 "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds/edscache"
)

// DefaultDebounce is how long the server waits after a registry change before rebuilding, so
// a burst of changes (a config reload, a health-check sweep) becomes one push.
const DefaultDebounce = 50 * time.Millisecond

// Server is tether's ADS server. It follows the registry, rebuilds the xDS resources of every
// snapshot key, and serves them to Envoy and gRPC clients over state-of-the-world and delta
// ADS on one gRPC listener.
//
// Clusters, listeners and routes come, on state-of-the-world streams, from one cache that
// marshals each resource once per version and shares it across clients (sotwcache.go), and on
// delta streams from go-control-plane SnapshotCaches (for Envoy nodes with ads=true, so a
// response waits until all referenced resources are requested; for gRPC nodes, which
// subscribe by name, without); both are fed the same snapshots. ClusterLoadAssignments come
// from one endpoint cache shared by every node (package edscache), behind a MuxCache, so one
// instance change sends one small EDS update instead of a new snapshot to every node, in one
// pass over the open watches. Every version is a content hash (ContentVersion per type for the snapshots;
// per CLA a hash of it and its clusters, and per EDS response a hash of what the client then
// holds), never a counter: an unchanged model never causes a push, and replicas fed the same
// registry state serve identical versions. Whenever clusters, listeners or routes are rebuilt,
// the complete snapshot passes Consistent() (and the WithSnapshotCheck hook) before anything is
// published; an endpoint-only change cannot alter what Consistent() checks and skips it (the hook
// still runs when set). A failing rebuild is logged and the previous configuration stays in
// place.
//
// All methods are safe for concurrent use. Run may be called once.
type Server struct {
	reg      *registry.Registry
	log      *slog.Logger
	nodes    nodes
	debounce time.Duration
	grpcOpts []grpc.ServerOption

	pub     *publisher
	mux     *cache.MuxCache
	tracker *tracker
	running atomic.Bool
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: discard). NACKs are logged at Warn, failed rebuilds at
// Error, go-control-plane's own messages at Debug.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithParams sets the builder parameters of the default Envoy snapshot (default: zero Params,
// i.e. every default).
func WithParams(p Params) Option { return func(s *Server) { s.nodes.envoy = p } }

// WithGRPCParams sets the parameters of the proxyless gRPC profile (GRPCExtProcTarget; no
// other field applies to it).
func WithGRPCParams(p Params) Option { return func(s *Server) { s.nodes.grpc = p } }

// WithNodeParams gives the node with this id its own Envoy snapshot built with p (for example
// managed listeners on one gateway but not on another), whatever kind of client it is. Other
// nodes are unaffected.
func WithNodeParams(nodeID string, p Params) Option {
	return func(s *Server) { s.nodes.byNode[nodeID] = p }
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
	return func(s *Server) { s.pub.check = check }
}

// WithGRPCServerOptions adds options to the gRPC server Run creates (after tether's keepalive
// defaults, so they can override them).
func WithGRPCServerOptions(opts ...grpc.ServerOption) Option {
	return func(s *Server) { s.grpcOpts = append(s.grpcOpts, opts...) }
}

// NewServer returns a server for reg. Nothing is built or served until Run.
func NewServer(reg *registry.Registry, opts ...Option) *Server {
	s := &Server{
		reg:      reg,
		log:      slog.New(slog.DiscardHandler),
		nodes:    nodes{byNode: map[string]Params{}},
		debounce: DefaultDebounce,
		pub:      &publisher{eds: map[string]edsEntry{}},
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
	// while the snapshot holds other names, so their snapshots live in a non-ADS cache (the
	// state-of-the-world cache makes the same distinction by key).
	s.pub.snapshots = cache.NewSnapshotCache(true, nodeHash(s.nodes.key), lg)
	s.pub.grpcSnapshots = cache.NewSnapshotCache(false, nodeHash(s.nodes.key), lg)
	s.pub.sotw = newSOTWCache(s.nodes.key, func(key string) bool { return key != DefaultGRPCSnapshot })
	s.pub.endpoints = edscache.New()
	s.mux = &cache.MuxCache{
		Classify: func(r *cache.Request) string {
			if c := s.nodes.cache(r.GetTypeUrl(), r.GetNode()); c == "eds" {
				return c
			}
			return "sotw"
		},
		ClassifyDelta: func(r *cache.DeltaRequest) string { return s.nodes.cache(r.GetTypeUrl(), r.GetNode()) },
		Caches:        map[string]cache.Cache{"eds": s.pub.endpoints, "sotw": s.pub.sotw, "envoy": s.pub.snapshots, "grpc": s.pub.grpcSnapshots},
	}
	s.tracker = newTracker(s.log, s.nodes.key)
	for _, kp := range s.nodes.profiles() {
		s.pub.profiles = append(s.pub.profiles, &profile{key: kp.key, pr: kp.Profile})
	}
	return s
}

// NodeProfile returns the Profile of the snapshot node n is served: Resources(NodeProfile(n),
// snap) is what n receives for the registry snapshot snap (endpoints included).
func (s *Server) NodeProfile(n *corev3.Node) Profile {
	key := s.nodes.key(n)
	for _, p := range s.pub.profiles {
		if p.key == key {
			return p.pr
		}
	}
	return Profile{}
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
	if err := s.pub.publish(ctx, <-updates); err != nil {
		_ = lis.Close()
		return fmt.Errorf("xds: initial snapshot: %w", err)
	}

	lg := logAdapter(s.log)
	filters := edscache.NewFilters(s.tracker.droppedACK)
	xdsServer := serverv3.NewServer(ctx, s.mux, filters.Callbacks(s.tracker.callbacks()), sotwv3.WithLogger(lg), deltav3.WithLogger(lg))
	gs := grpc.NewServer(append([]grpc.ServerOption{filters.ServerOption()}, s.grpcOpts...)...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, adsServer{Server: xdsServer, filters: filters})
	// grpc.health.v1 for Envoy's health check of the xDS cluster when it lists several
	// replicas: SERVING from the first publish on, NOT_SERVING from shutdown on.
	hs := health.NewServer()
	hs.SetServingStatus(XDSServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)

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
	hs.Shutdown()
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
	if err := s.pub.publish(ctx, snap); err != nil {
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
	// NACKs counts the configurations clients rejected since start (every node, every type).
	NACKs uint64
}

// Stats returns the publishing counters.
func (s *Server) Stats() PublishStats {
	st := s.pub.stats()
	if s.tracker != nil {
		st.NACKs = s.tracker.nackCount()
	}
	return st
}

// adsServer is go-control-plane's ADS server with the endpoint cache's ACK filter on every
// state-of-the-world stream.
type adsServer struct {
	serverv3.Server
	filters *edscache.Filters
}

func (s adsServer) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return s.Server.StreamAggregatedResources(s.filters.Wrap(stream))
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
