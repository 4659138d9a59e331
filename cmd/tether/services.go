package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/connlimit"
	"github.com/tether-dev/tether/pkg/envoyvalidate"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/fleet"
	"github.com/tether-dev/tether/pkg/protocol"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/servertls"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/status"
	"github.com/tether-dev/tether/pkg/xds"
)

// services is everything serve runs besides the API listener: the session store, the engine,
// and the ext_proc, xDS and SIP decision listeners. Fields for listeners that are off are nil.
type services struct {
	log      *slog.Logger
	registry *registry.Registry
	store    storeRunner       // a memstore.Store, or a redisstore.Store shared with other replicas
	leases   *quota.Leases     // request-slot leases (redis backend only)
	fleet    *fleet.Registry   // the registry's admin layer shared through Redis (redis backend only)
	proto    *protocol.Watcher // the protocol spoken in Redis (redis backend only)
	engine   *affinity.Engine
	extProc  *extproc.Server
	xds      *xds.Server
	// calls counts SIP calls per instance for services with calls.track.
	calls *calls.Tracker

	// tls serves every listener's certificate; nil when tls is off.
	tls *servertls.Source

	// events, status and metrics are the operator view (pkg/status); webhook is nil unless
	// autoscaling.webhook.url is set.
	events       *status.Events
	status       *status.Assembler
	metrics      *status.Metrics
	history      *status.History // the dashboard's decision counts over the last 5 minutes
	webhook      *status.Webhook
	scaleInAfter time.Duration

	extProcGRPC *grpc.Server
	extProcLis  net.Listener
	xdsLis      net.Listener
	sipSrv      *http.Server
	sipLis      net.Listener
	// conns are the listeners' connection caps, by listener name (pkg/connlimit).
	conns map[string]*connlimit.Listener
}

// Connection caps: each listener may hold this share of the process's descriptors (at most
// the ceiling), so one listener's flood leaves the others, and outbound connections (Redis,
// health checks, the webhook) and files, the rest. ext_proc and xDS conns are few (Envoy opens
// one per worker); a client's streams per connection are bounded too.
const (
	extProcConnShare, extProcConnCeiling = 0.2, 4096
	xdsConnShare, xdsConnCeiling         = 0.2, 1 << 20 // xDS fleets reach 10,000 clients
	sipConnShare, sipConnCeiling         = 0.1, 1024
	// apiConnShare and apiConnCeiling are api.maxConnections' default.
	apiConnShare, apiConnCeiling = 0.2, 1024
	// extProcStreamsPerConn bounds one ext_proc connection's concurrent streams (Envoy opens
	// another connection beyond it); xdsStreamsPerConn one xDS connection's (Envoy and gRPC
	// clients open one ADS stream).
	extProcStreamsPerConn = 4096
	xdsStreamsPerConn     = 16
)

// callExpiryInterval is how often calls never reported ended are looked for.
const callExpiryInterval = 10 * time.Second

// configureCalls applies the services' calls settings to the call tracker (at start and on
// every reload). A service whose calls.track is off counts nothing: its decisions never
// begin a call.
func (rt *services) configureCalls(cfg *config.Config) {
	for _, s := range cfg.Services {
		if s.Calls.Track {
			rt.calls.SetLimits(s.Name, calls.Limits{Cap: s.Calls.CapPerInstance, TTL: s.Calls.TTL, SetupTTL: s.Calls.SetupTTL,
				SourceSetup: s.Calls.SourceSetup()})
		} else {
			rt.calls.Untrack(s.Name)
		}
	}
}

// sipReadTimeout bounds reading one SIP decision request, headers and body.
const sipReadTimeout = sipdecide.ReadTimeout

// newServices builds the store (restoring its snapshot), the engine and the servers, and binds
// every configured listener, so that a port conflict fails startup before anything runs.
func newServices(ctx context.Context, cfg *config.Config, reg *registry.Registry, log *slog.Logger) (_ *services, err error) {
	// rt is a local, not the named result: every error return sets the result to nil, and the
	// cleanup must still reach the listeners bound so far.
	rt := &services{log: log, registry: reg}
	defer func() {
		if err != nil {
			rt.closeListeners()
		}
	}()

	engineOpts := []affinity.Option{
		affinity.WithLogger(log.With("component", "engine")),
		affinity.WithMaxRequestLifetime(cfg.ExtProc.MaxRequestLifetime),
		affinity.WithProvisionalIdleTimeout(cfg.NewSessions.ProvisionalIdleTimeout),
		affinity.WithNewSessionLimit(cfg.NewSessions.Limit()),
	}
	storeOpts, err := rt.openStore(ctx, cfg, reg, log)
	if err != nil {
		return nil, err
	}
	engineOpts = append(engineOpts, storeOpts...)

	// The engine logs every scale-out itself and hands it to the event log (the snapshot's
	// recent events, the webhook); the gauge is in the instances listing and on /metrics. It
	// sets itself as the store's end handler.
	rt.events = status.NewEvents(nil, log.With("component", "status"))
	engineOpts = append(engineOpts, affinity.WithScaleOutHook(rt.events.ScaleOut))
	rt.engine, err = affinity.New(reg, rt.store, engineOpts...)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	rt.newStatus(cfg, reg, log)
	decider := rt.metrics.TimedDecider(rt.engine, reg)
	if err := rt.newTLS(cfg, log); err != nil {
		return nil, err
	}
	rt.conns = map[string]*connlimit.Listener{}
	if addr := cfg.Listeners.ExtProc; addr != "" {
		if rt.extProcLis, err = rt.listen(ctx, "extProc", addr, connlimit.Share(extProcConnShare, extProcConnCeiling), "h2"); err != nil {
			return nil, err
		}
		rt.newExtProc(cfg, decider, log)
	}
	if addr := cfg.Listeners.XDS; addr != "" {
		if rt.xdsLis, err = rt.listen(ctx, "xds", addr, connlimit.Share(xdsConnShare, xdsConnCeiling), "h2"); err != nil {
			return nil, err
		}
		rt.newXDS(cfg, reg, log)
	}
	rt.configureCalls(cfg)
	rt.metrics.Registry().MustRegister(connlimit.Collector(rt.conns)) // the API's cap joins in serve, before it serves
	if addr := cfg.Listeners.SIP; addr != "" {
		if rt.sipLis, err = rt.listen(ctx, "sip", addr, connlimit.Share(sipConnShare, sipConnCeiling), "h2", "http/1.1"); err != nil {
			return nil, err
		}
		rt.newSIP(cfg, decider, log)
	}
	return rt, nil
}

// openStore opens the session store the config asks for: Redis (with its leases and fleet)
// or memdb (restoring its snapshot). It returns the engine options the store needs.
func (rt *services) openStore(ctx context.Context, cfg *config.Config, reg *registry.Registry, log *slog.Logger) ([]affinity.Option, error) {
	if cfg.Store.Backend == config.StoreRedis {
		rs, leases, err := openRedisStore(cfg, log)
		if err != nil {
			return nil, err
		}
		rt.store, rt.leases = rs, leases
		if rt.proto, err = openProtocol(ctx, rs, leases, log); err != nil {
			rs.Close()
			return nil, err
		}
		if rt.fleet, err = openFleet(ctx, cfg, rs, reg, log); err != nil {
			rs.Close()
			return nil, err
		}
		return []affinity.Option{affinity.WithSharedSlots(leases.SharedSlots(rs))}, nil
	}
	storeOpts := []memstore.Option{
		memstore.WithLogger(log.With("component", "session")),
		memstore.WithRetention(cfg.Store.Retention),
	}
	if cfg.Store.SnapshotPath != "" {
		storeOpts = append(storeOpts, memstore.WithSnapshot(cfg.Store.SnapshotPath, cfg.Store.SnapshotInterval))
	}
	mem := memstore.New(storeOpts...)
	if cfg.Store.SnapshotPath != "" {
		if err := restoreSessions(mem, cfg.Store, log); err != nil {
			return nil, err
		}
	}
	rt.store = mem
	return nil, nil
}

// newStatus builds the status snapshot, its history, the metrics and the scale-out webhook.
func (rt *services) newStatus(cfg *config.Config, reg *registry.Registry, log *slog.Logger) {
	outcomes := status.NewOutcomes()
	rt.calls = calls.New()
	statusOpts := []status.Option{status.WithEvents(rt.events), status.WithOutcomes(outcomes), status.WithCalls(rt.calls.Loads)}
	if rs, ok := rt.store.(*redisstore.Store); ok && rt.leases != nil {
		statusOpts = append(statusOpts, status.WithStore(redisStatus(rs, rt.leases)))
	}
	rt.status = status.New(reg, rt.engine, append(statusOpts,
		status.WithExtProc(func() *tetherv1.ExtProcStatus {
			if rt.extProc == nil {
				return nil
			}
			return status.ExtProcStatus(rt.extProc.Stats())
		}),
		status.WithXDS(func() *tetherv1.XdsStatus {
			if rt.xds == nil {
				return nil
			}
			return status.XDSStatus(rt.xds.Stats(), rt.xds.Status())
		}))...)
	rt.history = status.NewHistory(outcomes, 0, 0, nil)
	rt.metrics = status.NewMetrics(rt.status, rt.events, outcomes)
	if rt.leases != nil {
		registerQuotaMetrics(rt.metrics.Registry(), rt.leases)
	}
	rt.scaleInAfter = cfg.Autoscaling.ScaleInAfter
	if w := cfg.Autoscaling.Webhook; w.URL != "" {
		rt.webhook = status.NewWebhook(w.URL, []byte(w.Secret),
			status.WithWebhookClient(&http.Client{Timeout: w.Timeout}),
			status.WithRetries(w.MaxAttempts, time.Second, 30*time.Second),
			status.WithWebhookLogger(log.With("component", "webhook")))
		rt.events.Subscribe(rt.webhook.Enqueue)
	}
}

// newTLS loads the listeners' certificates, if the config has them.
func (rt *services) newTLS(cfg *config.Config, log *slog.Logger) error {
	if !cfg.TLS.Enabled() {
		return nil
	}
	var err error
	rt.tls, err = servertls.New(servertls.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, ClientCAFile: cfg.TLS.ClientCAFile},
		servertls.WithLogger(log.With("component", "tls")))
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	log.Info("TLS on every listener", "cert", cfg.TLS.CertFile, "notAfter", rt.tls.NotAfter(), "mutualTLS", rt.tls.MutualTLS())
	return nil
}

// listen binds listener name at addr, capped at maxConns connections (counted in rt.conns) and
// secured with rt's TLS for protos.
func (rt *services) listen(ctx context.Context, name, addr string, maxConns int, protos ...string) (net.Listener, error) {
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listeners.%s: %w", name, err)
	}
	capped := connlimit.New(lis, maxConns)
	rt.conns[name] = capped
	return rt.secure(name, capped, protos...), nil
}

// newExtProc builds the ext_proc server and its gRPC server.
func (rt *services) newExtProc(cfg *config.Config, decider status.Decider, log *slog.Logger) {
	rt.extProc = extproc.NewServer(decider,
		extproc.WithLogger(log.With("component", "extproc")),
		extproc.WithDestinationHeader(cfg.ExtProc.DestinationHeader),
		extproc.WithMetadataNamespace(cfg.ExtProc.MetadataNamespace),
		extproc.WithServedHostKey(cfg.ExtProc.ServedHostKey),
		extproc.WithFirstMessageTimeout(cfg.ExtProc.FirstMessageTimeout),
		extproc.WithMessageTimeout(cfg.ExtProc.MessageTimeout),
		extproc.WithDefaultService(cfg.ExtProc.DefaultService))
	// ServerOptions accept Envoy's keepalive pings on idle long-lived streams (SSE).
	rt.extProcGRPC = grpc.NewServer(append(extproc.ServerOptions(), grpc.MaxConcurrentStreams(extProcStreamsPerConn))...)
	extproc.Register(rt.extProcGRPC, rt.extProc)
}

// newXDS builds the xDS server.
func (rt *services) newXDS(cfg *config.Config, reg *registry.Registry, log *slog.Logger) {
	rt.xds = xds.NewServer(reg,
		xds.WithLogger(log.With("component", "xds")),
		xds.WithParams(xdsParams(cfg)),
		xds.WithGRPCParams(xds.Params{GRPCExtProcTarget: cfg.ExtProc.GRPCClientTarget}),
		xds.WithGRPCServerOptions(grpc.MaxConcurrentStreams(xdsStreamsPerConn)),
		// Every snapshot is validated as Envoy would (PGV rules, into every Any, cluster
		// references) before it is published; a failing one keeps the previous config.
		xds.WithSnapshotCheck(func(s *cache.Snapshot) error {
			return envoyvalidate.ValidateSnapshot(s, envoyvalidate.WithClusters(xds.ExtProcClusterName, xds.XDSClusterName))
		}))
}

// newSIP builds the SIP decision server.
func (rt *services) newSIP(cfg *config.Config, decider status.Decider, log *slog.Logger) {
	sipLog := log.With("component", "sipdecide")
	rt.sipSrv = sipdecide.NewServer(sipdecide.NewHandler(decider, sipdecide.WithLogger(sipLog),
		sipdecide.WithCalls(rt.calls), sipdecide.WithTrustedSources(cfg.NewSessions.Trusted())), sipLog)
	hookConns(rt.sipSrv, rt.conns["sip"])
}

// restoreSessions loads the snapshot. A snapshot that cannot be trusted fails startup and is
// left in place, unless store.onCorruptSnapshot is moveAside: then it is renamed out of the
// way, logged as an error, and tether starts with no sessions. A read error of the file
// system (permissions, I/O) always fails startup.
func restoreSessions(store *memstore.Store, cfg config.Store, log *slog.Logger) error {
	n, err := store.RestoreSnapshot(cfg.SnapshotPath)
	switch {
	case err == nil:
		log.Info("sessions restored", "path", cfg.SnapshotPath, "sessions", n)
		return nil
	case !errors.Is(err, memstore.ErrSnapshotCorrupt):
		return fmt.Errorf("restore sessions from %s: %w", cfg.SnapshotPath, err)
	case cfg.OnCorruptSnapshot != config.SnapshotMoveAside:
		return fmt.Errorf("restore sessions from %s: %w (the file is left as it is; set store.onCorruptSnapshot: moveAside to start without it)",
			cfg.SnapshotPath, err)
	}
	moved, merr := memstore.MoveSnapshotAside(cfg.SnapshotPath, time.Now())
	if merr != nil {
		return fmt.Errorf("restore sessions from %s: %w; and %w", cfg.SnapshotPath, err, merr)
	}
	log.Error("SESSIONS LOST: the session snapshot is unreadable; it was moved aside and tether starts with no sessions",
		"path", cfg.SnapshotPath, "movedTo", moved, "err", err)
	return nil
}

// secure wraps a bound listener in TLS when tls is on (protos are its ALPN protocols), and
// otherwise warns when it is reachable off this host in plain text (config validation has
// already required listeners.allowInsecure for that).
func (rt *services) secure(name string, lis net.Listener, protos ...string) net.Listener {
	if rt.tls != nil {
		return rt.tls.Listener(lis, protos...)
	}
	if ap, err := netip.ParseAddrPort(lis.Addr().String()); err == nil && !ap.Addr().IsLoopback() {
		rt.log.Warn("listener is not loopback and serves plain text: anyone who can reach it can read and forge its traffic (listeners.allowInsecure is set)",
			"listener", name, "addr", lis.Addr().String())
	}
	return lis
}

// addrs reports the bound listener addresses ("" when off).
func (rt *services) addrs() (extProc, xdsAddr, sip string) {
	name := func(l net.Listener) string {
		if l == nil {
			return ""
		}
		return l.Addr().String()
	}
	return name(rt.extProcLis), name(rt.xdsLis), name(rt.sipLis)
}

// run starts the background loops and servers on wg; each stops when ctx ends. A listener that
// dies reports on errs.
func (rt *services) run(ctx context.Context, wg *sync.WaitGroup, errs chan<- error) {
	rt.runWorkers(ctx, wg)
	rt.runListeners(ctx, wg, func(err error) {
		select {
		case errs <- err:
		default:
		}
	})
}

// runWorkers starts the background loops: store, history, leases, fleet, engine, call expiry,
// webhook, descriptor watch and scale-in.
func (rt *services) runWorkers(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() {
		if err := rt.store.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			rt.log.Error("session store stopped", "err", err)
		}
	})
	wg.Go(func() { rt.history.Run(ctx) })
	if rt.leases != nil {
		wg.Go(func() { _ = rt.leases.Run(ctx) })
	}
	if rt.fleet != nil {
		wg.Go(func() { _ = rt.fleet.Run(ctx) })
	}
	if rt.proto != nil {
		wg.Go(func() { rt.proto.Run(ctx) })
	}
	wg.Go(func() {
		if err := rt.engine.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			rt.log.Error("engine stopped", "err", err)
		}
	})
	wg.Go(func() {
		rt.calls.Run(ctx, callExpiryInterval, func(ended []calls.Call) {
			for _, c := range ended {
				rt.log.Warn("SIP call expired without an end report", "service", c.Service, "call", c.CallID,
					"instance", c.Instance, "state", c.State)
			}
		})
	})
	if rt.webhook != nil {
		wg.Go(func() { rt.webhook.Run(ctx) })
	}
	wg.Go(func() { connlimit.WatchDescriptors(ctx, rt.log.With("component", "fds"), 5*time.Second) })
	// Scale-in is looked for ten times per scaleInAfter (at most every 10 s, at least every 100 ms).
	wg.Go(func() {
		rt.events.WatchScaleIn(ctx, rt.registry, rt.engine, rt.scaleInAfter, min(max(rt.scaleInAfter/10, 100*time.Millisecond), 10*time.Second))
	})
}

// runListeners serves the ext_proc, xDS and SIP listeners; report takes a listener's failure.
func (rt *services) runListeners(ctx context.Context, wg *sync.WaitGroup, report func(error)) {
	if rt.extProcGRPC != nil {
		wg.Go(func() {
			if err := rt.extProcGRPC.Serve(rt.extProcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				report(fmt.Errorf("ext_proc listener: %w", err))
			}
		})
	}
	if rt.xds != nil {
		wg.Go(func() {
			if err := rt.xds.Run(ctx, rt.xdsLis); err != nil {
				report(fmt.Errorf("xds listener: %w", err))
			}
		})
	}
	if rt.sipSrv != nil {
		wg.Go(func() {
			if err := rt.sipSrv.Serve(rt.sipLis); !errors.Is(err, http.ErrServerClosed) {
				report(fmt.Errorf("sip listener: %w", err))
			}
		})
	}
	// Backstop: whatever way serve returns, ending ctx stops the servers (after a graceful
	// shutdown these calls find nothing left to do).
	wg.Go(func() {
		<-ctx.Done()
		if rt.extProcGRPC != nil {
			rt.extProcGRPC.Stop()
		}
		if rt.sipSrv != nil {
			_ = rt.sipSrv.Close()
		}
	})
}

// drainPlan is how the replica stops (config shutdown.*; see config.Shutdown).
type drainPlan struct {
	// moveAway is how long new side streams are still served after NOT_SERVING, while Envoy's
	// health checks move them to other replicas (wire.HealthCheckMoveAway).
	moveAway time.Duration
	// drainTimeout bounds the wait for answered exchanges (shutdown.drainTimeout).
	drainTimeout time.Duration
	// handoff hands answered exchanges off as soon as Envoy moved away (shutdown.handoff).
	handoff bool
	// grace bounds the SIP endpoint's shutdown and, after a handoff at the deadline, the wait
	// for exchanges tether had not yet answered.
	grace time.Duration
}

// drainPlanOf returns the drain of cfg.
func drainPlanOf(cfg *config.Config, moveAway, grace time.Duration) drainPlan {
	return drainPlan{moveAway: moveAway, drainTimeout: cfg.Shutdown.DrainTimeout, handoff: cfg.Shutdown.Handoff, grace: grace}
}

// shutdown drains the request-facing servers. ext_proc reports NOT_SERVING at once and keeps
// serving new streams for p.moveAway, until Envoy's health checks have moved them away; then
// it stops taking new streams (GOAWAY) and waits for the open ones: exchanges it has not
// answered yet finish normally, answered ones (past their response headers: SSE, MCP streams)
// are kept until they end or p.drainTimeout passes — or handed off at once with p.handoff —
// and at the deadline handed off (their side streams closed with OK: Envoy carries them on).
// An exchange is handed off only if its request slot can stay counted after it (on Redis: a
// detached hold until its service's maxLifetime, pkg/quota; never for a service without one);
// the others are kept to the deadline and then reset. The SIP endpoint stops accepting
// meanwhile. The store writes its final snapshot when serve's context ends.
func (rt *services) shutdown(p drainPlan) {
	if rt.extProc != nil {
		rt.extProc.Drain()
	}
	var wg sync.WaitGroup
	if rt.sipSrv != nil {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), max(p.grace, p.moveAway))
			defer cancel()
			if err := rt.sipSrv.Shutdown(ctx); err != nil {
				_ = rt.sipSrv.Close()
			}
		})
	}
	if rt.extProcGRPC != nil {
		wg.Go(func() { rt.drainExtProc(p) })
	}
	wg.Wait()
}

// hookConns lets l see srv's connections' states (idle, slow, serving), so that at its cap it
// evicts those rather than refusing a new client.
func hookConns(srv *http.Server, l *connlimit.Listener) {
	srv.ConnState = l.ConnState
	srv.ConnContext = l.ConnContext
	srv.Handler = l.Handler(srv.Handler)
}

func (rt *services) drainExtProc(p drainPlan) {
	rt.log.Info("ext_proc draining: NOT_SERVING, still serving new streams while Envoy moves away",
		"moveAway", p.moveAway, "drainTimeout", p.drainTimeout, "handoff", p.handoff)
	if p.moveAway > 0 {
		time.Sleep(p.moveAway)
	}
	done := make(chan struct{})
	go func() { rt.extProcGRPC.GracefulStop(); close(done) }()
	if p.handoff {
		rt.extProc.HandOff()
	}
	deadline := time.NewTimer(p.drainTimeout)
	defer deadline.Stop()
	select {
	case <-done:
		st := rt.extProc.Stats()
		rt.log.Info("ext_proc drained", "handedOff", st.HandedOff, "handoffRefused", st.HandoffRefused)
		return
	case <-deadline.C:
	}
	rt.extProc.HandOff()
	select {
	case <-done:
		st := rt.extProc.Stats()
		rt.log.Info("ext_proc drained", "handedOff", st.HandedOff, "handoffRefused", st.HandoffRefused)
	case <-time.After(p.grace + extproc.DefaultHandoffMaxWait):
		st := rt.extProc.Stats()
		rt.log.Warn("ext_proc exchanges still open at shutdown.drainTimeout (not yet answered, or not handed off: their request slot could not stay counted after them); resetting them",
			"open", st.OpenStreams, "handoffRefused", st.HandoffRefused)
		rt.extProcGRPC.Stop()
	}
}

// closeListeners releases bound listeners when startup fails before run.
func (rt *services) closeListeners() {
	for _, l := range []net.Listener{rt.extProcLis, rt.xdsLis, rt.sipLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}
