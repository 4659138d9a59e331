// Package discovery runs the discovery sources a config asks for (services[].discovery:
// kubernetes, xds, dns) and feeds their instances into the registry, where they merge with the
// config file's and the admin API's under the registry's precedence (see package registry).
//
// Each source reports to the registry under its own name ("kubernetes/<service>",
// "xds/<service>", "dns/<service>", and "gateway-api" for discovery.gatewayAPI, which declares
// services as well as instances), so its state (synced, failing, last error, counts) is in
// (*registry.Registry).Sources for the status API and metrics. A source that fails keeps its
// last good set published.
//
// Manager.Apply is called with each loaded config: sources whose settings did not change keep
// running untouched (a config reload does not re-list Kubernetes or re-resolve DNS), changed
// ones restart, removed ones stop and their instances leave the registry.
package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/discovery/ads"
	"github.com/tether-dev/tether/pkg/discovery/dns"
	"github.com/tether-dev/tether/pkg/discovery/gatewayapi"
	"github.com/tether-dev/tether/pkg/discovery/kubernetes"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/servertls"
)

// Manager starts, restarts and stops sources as configs are applied. Safe for concurrent use.
type Manager struct {
	reg *registry.Registry
	log *slog.Logger

	mu      sync.Mutex
	running map[string]*running // by runner key
}

type running struct {
	spec   any      // the comparable settings it was started with
	names  []string // registry source names it reports under
	cancel context.CancelFunc
	done   chan struct{}
}

// Option configures a Manager.
type Option func(*Manager)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(m *Manager) { m.log = l } }

// New returns a Manager feeding reg.
func New(reg *registry.Registry, opts ...Option) *Manager {
	m := &Manager{reg: reg, log: slog.New(slog.DiscardHandler), running: map[string]*running{}}
	for _, o := range opts {
		o(m)
	}
	return m
}

// runner is one source to run: its key, settings, registry names and how to start it.
type runner struct {
	key   string
	spec  any
	names []string
	kind  string
	start func(ctx context.Context) (run func(context.Context) error, cleanup func(), err error)
}

// Apply makes the running sources match cfg. Sources run until ctx ends or a later Apply drops
// them; Stop waits for them. A source that cannot start (a bad kubeconfig, say) is reported
// through the registry as failing and does not stop the others.
func (m *Manager) Apply(ctx context.Context, cfg *config.Config) {
	want := m.runners(cfg)
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, r := range m.running {
		if w, ok := want[key]; ok && reflect.DeepEqual(w.spec, r.spec) {
			continue
		}
		m.stopLocked(key)
		for _, n := range r.names {
			if w, ok := want[key]; !ok || !slices.Contains(w.names, n) {
				m.reg.RemoveSource(n)
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		if _, ok := m.running[key]; ok {
			continue
		}
		w := want[key]
		rctx, cancel := context.WithCancel(ctx)
		run, cleanup, err := w.start(rctx)
		if err != nil {
			cancel()
			m.log.Error("discovery source cannot start", "source", key, "err", err)
			for _, n := range w.names {
				m.reg.SourceFailed(n, w.kind, err)
			}
			// Remembered with its spec, so an unchanged config does not retry; an edit does.
			m.running[key] = &running{spec: w.spec, names: w.names, cancel: func() {}, done: closed()}
			continue
		}
		r := &running{spec: w.spec, names: w.names, cancel: cancel, done: make(chan struct{})}
		m.running[key] = r
		m.log.Info("discovery source started", "source", key)
		go func() {
			defer close(r.done)
			if cleanup != nil {
				defer cleanup()
			}
			_ = run(rctx)
		}()
	}
}

// Stop stops every source and waits for them; their last sets stay in the registry.
func (m *Manager) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key := range m.running {
		m.stopLocked(key)
	}
}

func (m *Manager) stopLocked(key string) {
	r := m.running[key]
	r.cancel()
	<-r.done
	delete(m.running, key)
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

type kubeSpec struct {
	Conn   config.KubernetesConnection
	Target kubernetes.Target
}

type gatewaySpec struct {
	Conn   config.KubernetesConnection
	Source config.GatewayAPISource
}

type adsSpec struct {
	Conn    config.XDSConnection
	Targets []ads.Target
}

// runners lists the sources cfg asks for, by key.
func (m *Manager) runners(cfg *config.Config) map[string]runner {
	out := map[string]runner{}
	var adsTargets []ads.Target
	add := func(r runner) { out[r.key] = r }
	for _, s := range cfg.Services {
		switch d := s.Discovery; d.Kind {
		case config.DiscoveryKubernetes:
			add(m.kubernetesRunner(cfg, s.Name, d.Kubernetes))
		case config.DiscoveryDNS:
			add(m.dnsRunner(s.Name, d.DNS))
		case config.DiscoveryXDS:
			adsTargets = append(adsTargets, ads.Target{Service: s.Name, Cluster: d.XDS.Cluster})
		}
	}
	if g := cfg.Discovery.GatewayAPI; g.Enabled {
		add(m.gatewayRunner(gatewaySpec{Conn: cfg.Discovery.Kubernetes, Source: g}))
	}
	if len(adsTargets) > 0 {
		add(m.adsRunner(adsSpec{Conn: cfg.Discovery.XDS, Targets: adsTargets}))
	}
	return out
}

// kubernetesRunner runs the Kubernetes source of service.
func (m *Manager) kubernetesRunner(cfg *config.Config, service string, k config.KubernetesSource) runner {
	spec := kubeSpec{Conn: cfg.Discovery.Kubernetes, Target: kubernetes.Target{
		Service: service, Namespace: k.Namespace, ServiceName: k.Service,
		Selector: k.Selector, HTTPPort: k.Ports.HTTP, SIPPort: k.Ports.SIP,
	}}
	key := kubernetes.Kind + "/" + service
	return runner{key: key, spec: spec, names: []string{key}, kind: kubernetes.Kind,
		start: func(context.Context) (func(context.Context) error, func(), error) {
			rc, err := kubernetes.RESTConfig(spec.Conn.Kubeconfig, spec.Conn.Context)
			if err != nil {
				return nil, nil, err
			}
			src, err := kubernetes.New(rc, m.reg, spec.Target, kubernetes.WithLogger(m.log.With("source", key)))
			if err != nil {
				return nil, nil, err
			}
			return src.Run, nil, nil
		}}
}

// dnsRunner runs the DNS source of service.
func (m *Manager) dnsRunner(service string, d config.DNSSource) runner {
	t := dns.Target{Service: service, Name: d.Name, Type: d.Type, HTTPPort: d.Ports.HTTP,
		SIPPort: d.Ports.SIP, Server: d.Server, MinRefresh: d.MinRefresh, MaxRefresh: d.MaxRefresh}
	key := dns.Kind + "/" + service
	return runner{key: key, spec: t, names: []string{key}, kind: dns.Kind,
		start: func(context.Context) (func(context.Context) error, func(), error) {
			src, err := dns.New(t, m.reg, dns.WithLogger(m.log.With("source", key)))
			if err != nil {
				return nil, nil, err
			}
			return src.Run, nil, nil
		}}
}

// gatewayRunner runs the Gateway API source.
func (m *Manager) gatewayRunner(spec gatewaySpec) runner {
	return runner{key: gatewayapi.Kind, spec: spec, names: []string{gatewayapi.SourceName}, kind: gatewayapi.Kind,
		start: func(context.Context) (func(context.Context) error, func(), error) {
			rc, err := kubernetes.RESTConfig(spec.Conn.Kubeconfig, spec.Conn.Context)
			if err != nil {
				return nil, nil, err
			}
			src, err := gatewayapi.New(rc, m.reg, gatewayapi.Config{
				ControllerName: spec.Source.ControllerName,
				Namespace:      spec.Source.Namespace,
				GatewayClasses: spec.Source.GatewayClasses,
				RouteSelector:  spec.Source.RouteSelector,
				Defaults:       config.DefaultService,
			}, gatewayapi.WithLogger(m.log.With("source", gatewayapi.SourceName)))
			if err != nil {
				return nil, nil, err
			}
			return src.Run, nil, nil
		}}
}

// adsRunner runs the xDS (ADS) client that feeds every service discovered by xds.
func (m *Manager) adsRunner(spec adsSpec) runner {
	var names []string
	for _, t := range spec.Targets {
		names = append(names, ads.SourceName(t.Service))
	}
	return runner{key: ads.Kind, spec: spec, names: names, kind: ads.Kind,
		start: func(context.Context) (func(context.Context) error, func(), error) {
			// Plain-text gRPC to the mesh's control plane unless discovery.xds.tls is enabled
			// (a mesh's control plane usually asks for mTLS).
			creds := insecure.NewCredentials()
			if t := spec.Conn.TLS; t.Enabled {
				tc, err := servertls.ClientConfig(servertls.ClientFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName})
				if err != nil {
					return nil, nil, fmt.Errorf("xds: %s: %w", spec.Conn.Server, err)
				}
				creds = credentials.NewTLS(tc)
			}
			conn, err := grpc.NewClient(spec.Conn.Server, grpc.WithTransportCredentials(creds))
			if err != nil {
				return nil, nil, fmt.Errorf("xds: %s: %w", spec.Conn.Server, err)
			}
			c := ads.New(conn, spec.Conn.NodeID, spec.Conn.NodeCluster, m.reg, spec.Targets, ads.WithLogger(m.log.With("source", "xds")))
			return c.Run, func() { _ = conn.Close() }, nil
		}}
}
