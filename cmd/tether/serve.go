package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/connlimit"
	"github.com/tether-dev/tether/pkg/discovery"
	"github.com/tether-dev/tether/pkg/health"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/ui"
	"github.com/tether-dev/tether/pkg/wire"
)

// runServe runs tether until ctx ends (SIGINT/SIGTERM); SIGHUP reloads the config file.
func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("serve", "-c FILE", stderr)
	path := fs.String("c", "", "config `file`")
	if err := parseConfigArgs(fs, args, path, "the config to serve, e.g. examples/quickstart/tether.yaml"); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return serve(ctx, serveOptions{configPath: *path, logOut: stderr, reload: hup, runtime: true,
		moveAway: wire.HealthCheckMoveAway()})
}

// serveOptions are serve's inputs; tests fill them directly.
type serveOptions struct {
	configPath string
	// logOut receives the log (text or JSON as configured).
	logOut io.Writer
	// reload triggers a config reload on every receive (SIGHUP in production).
	reload <-chan os.Signal
	// ready, if set, is called once every listener is bound, with what tests need to reach
	// the running server.
	ready func(serveInfo)
	// shutdownTimeout bounds the graceful shutdown of the HTTP listener and the SIP endpoint
	// (default 10s).
	shutdownTimeout time.Duration
	// moveAway is how long a drain keeps serving new streams after NOT_SERVING, while Envoy's
	// health checks move them away: wire.HealthCheckMoveAway in tether serve; 0 (tests) none.
	moveAway time.Duration
	// runtime applies the config's process-wide Go runtime settings (runtime.*, see
	// planGC); tether serve does, in-process tests (several servers in one process) do not.
	runtime bool
}

// serveInfo describes a running server: bound addresses ("" for a listener that is off;
// port 0 in the config becomes the real port here) and its registry.
type serveInfo struct {
	apiAddr, extProcAddr, xdsAddr, sipAddr string
	registry                               *registry.Registry
	engine                                 *affinity.Engine
}

// serve loads the config, builds the registry, starts health checks, the session store and
// engine, the ext_proc, xDS, SIP decision and API listeners, and runs until ctx ends, reloading on opts.reload. It returns nil after a graceful shutdown,
// or an error if startup fails or a listener dies.
func serve(ctx context.Context, opts serveOptions) error {
	cfg, err := config.Load(opts.configPath)
	if err != nil {
		return err
	}
	if opts.shutdownTimeout == 0 {
		opts.shutdownTimeout = 10 * time.Second
	}
	level := new(slog.LevelVar)
	level.Set(cfg.Log.SlogLevel())
	log := newLogger(opts.logOut, cfg.Log.Format, level)
	for _, w := range cfg.Warnings {
		log.Warn("config: "+w, "config", opts.configPath)
	}
	if opts.runtime {
		defer startGC(planGC(cfg.Runtime, os.Getenv), log)()
	}

	reg := registry.New(registry.WithLogger(log.With("component", "registry")), registry.WithAddressPolicy(cfg.AddressPolicy()))
	if err := reg.Apply(cfg.Registry()); err != nil {
		return fmt.Errorf("apply config: %w", err)
	}

	// Everything started below stops when runCtx ends, after the drain: ctx ending (SIGTERM)
	// starts the drain, it must not stop the engine, the store or the listeners under it (it
	// did: every ext_proc stream was cut within milliseconds of the signal).
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()

	// Discovery sources (services[].discovery) feed the registry beside the config file.
	disc := discovery.New(reg, discovery.WithLogger(log.With("component", "discovery")))
	disc.Apply(runCtx, cfg)
	defer disc.Stop()

	rt, err := newServices(ctx, cfg, reg, log)
	if err != nil {
		return err
	}
	s := &serveRun{opts: opts, cfg: cfg, log: log, level: level, reg: reg, disc: disc, rt: rt,
		runCtx: runCtx, stop: stop, wg: &wg, serveErr: make(chan error, 1), drainReq: make(chan struct{})}
	rt.run(runCtx, &wg, s.serveErr)
	// With the redis backend one replica at a time checks health (a lease in Redis).
	checker := health.New(reg, rt.healthOptions(cfg)...)
	wg.Go(func() { _ = checker.Run(runCtx) })

	info := serveInfo{registry: reg, engine: rt.engine}
	info.extProcAddr, info.xdsAddr, info.sipAddr = rt.addrs()
	if cfg.Listeners.API != "" {
		if info.apiAddr, err = s.startAPI(ctx); err != nil {
			return err
		}
	}

	// Listeners on port 0 reserve the ports they were given (no instance may point at them).
	s.bound = registry.ReservedPorts(map[string]string{"listeners.api": info.apiAddr, "listeners.extProc": info.extProcAddr,
		"listeners.xds": info.xdsAddr, "listeners.sip": info.sipAddr})
	reg.SetAddressPolicy(cfg.AddressPolicy(s.bound...))

	snap := reg.Snapshot()
	log.Info("tether serving", "config", opts.configPath, "version", version, "api", info.apiAddr,
		"dashboard", dashboardURL(info.apiAddr, cfg.TLS.Enabled()),
		"extProc", info.extProcAddr, "xds", info.xdsAddr, "sip", info.sipAddr,
		"services", len(snap.Services()), "generation", snap.Generation)
	if opts.ready != nil {
		opts.ready(info)
	}
	return s.loop(ctx)
}

// serveRun is a running serve: what its API listener, its event loop and its drain share.
type serveRun struct {
	opts  serveOptions
	cfg   *config.Config // the running config (replaced by a valid reload)
	log   *slog.Logger
	level *slog.LevelVar
	reg   *registry.Registry
	disc  *discovery.Manager
	rt    *services
	bound []registry.ReservedPort // the listeners' own ports

	// runCtx ends (stop) after the drain; wg holds everything started under it.
	runCtx   context.Context
	stop     context.CancelFunc
	wg       *sync.WaitGroup
	serveErr chan error // a listener that died

	draining  atomic.Bool
	drainReq  chan struct{} // closed by POST /v1/replica/drain: the same drain as SIGTERM, then exit
	drainOnce sync.Once
	srv       *http.Server // nil when the API listener is off
	apiSrv    *api.Server  // nil when the API listener is off
}

// startAPI binds the API listener (connection-capped, TLS as configured) and serves the
// SessionAPI, operator endpoints and dashboard on it. It returns the bound address.
func (s *serveRun) startAPI(ctx context.Context) (string, error) {
	cfg := s.cfg
	// config.Parse already refuses this; the check also logs the allowInsecure warning.
	if err := api.CheckListenerSecurity(cfg.Listeners.API, cfg.Auth, s.log); err != nil {
		return "", err
	}
	raw, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.Listeners.API)
	if err != nil {
		return "", fmt.Errorf("listeners.api: %w", err)
	}
	maxConns := cfg.API.MaxConnections
	if maxConns == 0 {
		maxConns = connlimit.Share(apiConnShare, apiConnCeiling)
	}
	capped := connlimit.New(raw, maxConns)
	s.rt.conns["api"] = capped
	ln := s.rt.secure("api", capped, "h2", "http/1.1")
	s.apiSrv = api.NewServer(s.reg, s.apiOptions()...)
	// Timeouts bound what a slow client holds (the status stream and a drain's wait set
	// their own write deadlines, gRPC calls have none: their deadlines are the caller's);
	// the cap evicts the slowest connections for new ones (pkg/connlimit).
	srv := &http.Server{
		Handler:           s.apiSrv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       api.ReadTimeout,
		WriteTimeout:      api.WriteTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.With("component", "api").Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return s.runCtx },
	}
	s.srv = srv
	hookConns(srv, capped)
	api.EnableH2C(srv) // the SessionAPI's gRPC clients share this plain-text listener
	s.wg.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.serveErr <- fmt.Errorf("api listener: %w", err)
		}
	})
	return ln.Addr().String(), nil
}

// apiOptions are the API server's options: the engine, auth, hosts and origins, readiness
// (not ready once draining), the drain, metrics, status, dashboard, pprof and xDS endpoints.
func (s *serveRun) apiOptions() []api.Option {
	cfg, rt := s.cfg, s.rt
	apiOpts := []api.Option{
		api.WithLogger(s.log.With("component", "api")),
		api.WithEngine(rt.engine),
		api.WithStoreTimeout(cfg.API.StoreTimeout),
		api.WithAuth(cfg.Auth),
		api.WithHosts(append([]string{listenerHost(cfg.Listeners.API)}, cfg.API.Hosts...)...),
		api.WithOrigins(cfg.API.Origins...),
		api.WithCalls(rt.calls.Loads),
		api.WithReadyCheck("shutdown", func(context.Context) error {
			if s.draining.Load() {
				return errors.New("shutting down")
			}
			return nil
		}),
		api.WithOperatorHandler("POST /v1/replica/drain", http.HandlerFunc(s.drainHandler)),
		api.WithOperatorHandler("GET /metrics", rt.metrics.Handler()),
		api.WithStatus(rt.status.Snapshot, 0),
		api.WithStatusHistory(rt.history),
		api.WithUI(ui.Handler()),
	}
	apiOpts = append(apiOpts, pprofHandlers()...)
	if rt.xds != nil {
		apiOpts = append(apiOpts, api.WithOperatorHandler("GET /v1/xds/nodes", rt.xds.StatusHandler()))
	}
	return apiOpts
}

// drainHandler is POST /v1/replica/drain: it starts the drain (once) and answers 202 with the
// drain's plan.
func (s *serveRun) drainHandler(w http.ResponseWriter, _ *http.Request) {
	s.drainOnce.Do(func() { close(s.drainReq) })
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = fmt.Fprintf(w, "{\"draining\":true,\"moveAway\":%q,\"drainTimeout\":%q,\"handoff\":%t}\n",
		s.opts.moveAway, s.cfg.Shutdown.DrainTimeout, s.cfg.Shutdown.Handoff)
}

// loop runs until ctx ends (SIGTERM) or a drain is asked for, both drained (finish), or a
// listener dies (die), reloading the config on every opts.reload.
func (s *serveRun) loop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			s.log.Info("shutting down")
			return s.finish()
		case <-s.drainReq:
			s.log.Info("shutting down", "reason", "POST /v1/replica/drain")
			return s.finish()
		case err := <-s.serveErr:
			s.die()
			return err
		case <-s.opts.reload:
			s.reload()
		}
	}
}

// finish drains and stops everything (SIGTERM or an API drain).
func (s *serveRun) finish() error {
	s.draining.Store(true)
	s.rt.shutdown(drainPlanOf(s.cfg, s.opts.moveAway, s.opts.shutdownTimeout))
	shutdownErr := shutdown(s.srv, s.opts.shutdownTimeout)
	s.stop()
	s.wg.Wait()
	if shutdownErr != nil {
		return shutdownErr
	}
	s.log.Info("stopped")
	return nil
}

// die stops everything after a listener died: no wait for Envoy, the drain bounded by the
// shutdown timeout.
func (s *serveRun) die() {
	s.draining.Store(true)
	p := drainPlanOf(s.cfg, 0, s.opts.shutdownTimeout)
	p.drainTimeout = min(p.drainTimeout, s.opts.shutdownTimeout)
	s.rt.shutdown(p)
	_ = shutdown(s.srv, s.opts.shutdownTimeout)
	s.stop()
}

// reload applies the config file again (see reload); a valid one replaces the running config.
func (s *serveRun) reload() {
	next := reload(s.log, s.level, s.reg, s.cfg, s.opts.configPath, s.bound)
	if next == nil {
		return
	}
	s.disc.Apply(s.runCtx, next)
	// Tokens apply from the next request on: a removed token stops working at once.
	if s.apiSrv != nil && !reflect.DeepEqual(s.cfg.Auth, next.Auth) {
		s.apiSrv.SetAuth(next.Auth)
		s.log.Info("config change", "change", "auth tokens replaced", "tokens", len(next.Auth.Tokens))
	}
	s.rt.configureCalls(next)
	s.cfg = next
}

// listenerHost is the host of a host:port listener address ("" for none or a malformed one).
func listenerHost(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}

func newLogger(w io.Writer, format string, level slog.Leveler) *slog.Logger {
	o := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// shutdown stops accepting connections and waits (up to timeout) for requests in flight.
func shutdown(srv *http.Server, timeout time.Duration) error {
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close() // force the rest closed; the Shutdown error is the one to report
		return fmt.Errorf("api listener shutdown: %w", err)
	}
	return nil
}

// reload reads the config file again and applies it to the registry, which keeps health and
// runtime state of the instances that stay. It logs what changed and returns the new config,
// or logs every problem and returns nil (the running config stays) if the file is invalid.
func reload(log *slog.Logger, level *slog.LevelVar, reg *registry.Registry, old *config.Config, path string, bound []registry.ReservedPort) *config.Config {
	next, err := config.Load(path)
	if err != nil {
		var errs config.Errors
		if errors.As(err, &errs) {
			for _, fe := range errs {
				log.Error("config reload: invalid", "problem", fe.Error())
			}
		} else {
			log.Error("config reload: cannot read", "err", err)
		}
		log.Error("config reload rejected; keeping the running config", "config", path)
		return nil
	}
	for _, w := range next.Warnings {
		log.Warn("config reload: "+w, "config", path)
	}
	if old.Auth.Enabled() && !next.Auth.Enabled() {
		// An emptied token list (a template that rendered none, a bad merge) must not turn
		// authentication off unnoticed: only an explicit auth.allowInsecure does, loudly.
		if !next.Auth.AllowInsecure {
			log.Error("config reload rejected; keeping the running config: it leaves no auth token or client identity, which would turn API authentication off; keep one, or set auth.allowInsecure: true to serve the API without authentication", "config", path)
			return nil
		}
		log.Warn("config reload turns API authentication OFF (no tokens or client identities; auth.allowInsecure is set): every caller may now read and change everything", "config", path)
	}
	// The new level applies first, so that the reload itself logs at it.
	oldLevel := level.Level()
	if l := next.Log.SlogLevel(); l != oldLevel {
		level.Set(l)
		log.Info("config change", "change", "log.level "+next.Log.Level)
	}
	// The new address policy applies first: the new config's instances were validated against it.
	oldPolicy := reg.AddressPolicy()
	reg.SetAddressPolicy(next.AddressPolicy(bound...))
	if err := reg.Apply(next.Registry()); err != nil {
		reg.SetAddressPolicy(oldPolicy)
		level.Set(oldLevel)
		log.Error("config reload rejected by the registry; keeping the running config", "config", path, "err", err)
		return nil
	}
	changes := diffConfigs(old, next)
	for _, c := range changes {
		log.Info("config change", "change", c)
	}
	for _, f := range restartFields(old, next) {
		log.Warn("config change needs a restart to take effect", "field", f)
	}
	log.Info("config reloaded", "config", path, "changes", len(changes), "generation", reg.Snapshot().Generation)
	return next
}

// diffConfigs lists the services and instances added, removed or changed between two configs,
// in a stable order: services by name, then instances by service and id.
func diffConfigs(old, next *config.Config) []string {
	oldSvcs, oldIns := old.Registry()
	newSvcs, newIns := next.Registry()
	var out []string
	diff := func(kind string, before, after map[string]any) {
		for _, k := range sortedUnion(before, after) {
			b, inBefore := before[k]
			a, inAfter := after[k]
			switch {
			case !inBefore:
				out = append(out, fmt.Sprintf("%s %s added", kind, k))
			case !inAfter:
				out = append(out, fmt.Sprintf("%s %s removed", kind, k))
			case !reflect.DeepEqual(a, b):
				out = append(out, fmt.Sprintf("%s %s changed", kind, k))
			}
		}
	}
	byName := func(svcs []registry.Service) map[string]any {
		m := map[string]any{}
		for _, s := range svcs {
			m[s.Name] = s
		}
		return m
	}
	byKey := func(ins []registry.Instance) map[string]any {
		m := map[string]any{}
		for _, in := range ins {
			m[in.Service+"/"+in.ID] = in
		}
		return m
	}
	diff("service", byName(oldSvcs), byName(newSvcs))
	diff("instance", byKey(oldIns), byKey(newIns))
	return out
}

func sortedUnion(a, b map[string]any) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range []map[string]any{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// restartFields names the top-level settings that changed but are only read at startup.
func restartFields(old, next *config.Config) []string {
	var out []string
	for _, f := range []struct {
		name      string
		old, next any
	}{
		{"listeners", old.Listeners, next.Listeners},
		{"log.format", old.Log.Format, next.Log.Format},
		{"store", old.Store, next.Store},
		{"tls", old.TLS, next.TLS},
		{"extProc", old.ExtProc, next.ExtProc},
		{"envoy", old.Envoy, next.Envoy},
		{"runtime", old.Runtime, next.Runtime},
	} {
		if !reflect.DeepEqual(f.old, f.next) {
			out = append(out, f.name)
		}
	}
	return out
}

// dashboardURL is where the dashboard (pkg/ui) answers on the API listener addr, "" when the
// API is off; an unspecified host (0.0.0.0, ::) is shown as localhost.
func dashboardURL(addr string, tls bool) string {
	if addr == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/ui/"
}
