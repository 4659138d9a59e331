package mcpe2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/mcpts"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/xds"
)

const exampleConfig = "../../examples/mcp/tether.yaml"

func loadExample(t *testing.T) ([]registry.Service, []registry.Instance) {
	t.Helper()
	cfg, err := config.Load(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Registry()
}

// TestExampleRoutesKeepStreamsOpen checks what keeps long MCP streams alive in the Envoy
// configuration tether generates for examples/mcp/tether.yaml, in every form Envoy gets it
// (RDS with managed listeners, and the static listener of the bootstrap): every MCP route has
// timeout 0 (Envoy's default of 15 s would cut an idle SSE stream) and idle_timeout 0 (the
// connection manager's 5 min stream idle timeout would cut a quiet one), and an SSE service's
// maxLifetime becomes max_stream_duration. The harness models neither timeout, so this is
// what the idle test relies on for a real Envoy.
func TestExampleRoutesKeepStreamsOpen(t *testing.T) {
	services, instances := loadExample(t)
	byName := map[string]registry.Service{}
	for _, s := range services {
		byName[s.Name] = s
	}
	check := func(t *testing.T, rc *routev3.RouteConfiguration) {
		t.Helper()
		seen := map[string]bool{}
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				svc, ok := byName[r.GetRoute().GetCluster()]
				if !ok {
					t.Fatalf("route %q to unknown cluster %q", r.GetName(), r.GetRoute().GetCluster())
				}
				seen[svc.Name] = true
				a := r.GetRoute()
				if a.GetTimeout() == nil || a.GetTimeout().AsDuration() != 0 {
					t.Errorf("route %s: timeout %v, want 0 (disabled)", r.GetName(), a.GetTimeout())
				}
				if a.GetIdleTimeout() == nil || a.GetIdleTimeout().AsDuration() != 0 {
					t.Errorf("route %s: idle_timeout %v, want 0 (disabled)", r.GetName(), a.GetIdleTimeout())
				}
				got := a.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration()
				if got != svc.MaxLifetime {
					t.Errorf("route %s: max_stream_duration %v, want maxLifetime %v", r.GetName(), got, svc.MaxLifetime)
				}
			}
		}
		for name := range byName {
			if !seen[name] {
				t.Errorf("no route for service %s", name)
			}
		}
	}
	if got := byName["legacy-tools"].MaxLifetime; got != time.Hour {
		t.Fatalf("example legacy-tools maxLifetime = %v, want 1h (the test relies on it)", got)
	}

	t.Run("RDS", func(t *testing.T) {
		rc, err := xds.RouteConfiguration(xds.RouteConfigName, services)
		if err != nil {
			t.Fatal(err)
		}
		check(t, rc)
	})
	t.Run("managed listeners", func(t *testing.T) {
		reg := registry.New()
		if err := reg.Apply(services, instances); err != nil {
			t.Fatal(err)
		}
		rs, err := xds.Build(reg.Snapshot(), xds.Params{ManagedListeners: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs.Routes) != 1 {
			t.Fatalf("%d route configurations, want 1", len(rs.Routes))
		}
		check(t, rs.Routes[0])
	})
	t.Run("bootstrap", func(t *testing.T) {
		b, err := xds.Bootstrap(services, xds.BootstrapParams{XDSAddress: "127.0.0.1:18000", ExtProcAddress: "127.0.0.1:9002"})
		if err != nil {
			t.Fatal(err)
		}
		ls := b.GetStaticResources().GetListeners()
		if len(ls) != 1 {
			t.Fatalf("%d static listeners, want 1", len(ls))
		}
		check(t, inlineRoutes(t, ls[0]))
	})
}

// inlineRoutes returns the route configuration inlined in a listener's connection manager.
func inlineRoutes(t *testing.T, l *listenerv3.Listener) *routev3.RouteConfiguration {
	t.Helper()
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			var hcm hcmv3.HttpConnectionManager
			if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
				continue
			}
			if rc := hcm.GetRouteConfig(); rc != nil {
				return rc
			}
		}
	}
	t.Fatal("no inline route configuration in the bootstrap listener")
	return nil
}

// TestExampleDeployment runs examples/mcp/tether.yaml as shipped (services and instance ids;
// only the instance addresses point at the replicas started here): Go and TS Streamable HTTP
// clients at /mcp and a Go HTTP+SSE client at /sse are each pinned to one replica of their
// service, and an HTTP+SSE GET with a query is refused.
func TestExampleDeployment(t *testing.T) { e2e.ForEachKind(t, testExampleDeployment) }

func testExampleDeployment(t *testing.T, kind e2e.Kind) {
	services, instances := loadExample(t)
	ids := make([]string, len(instances))
	for i, in := range instances {
		ids[i] = in.ID
	}
	for i, s := range startGoReplicas(t, mcpreplica.Options{}, ids...) {
		instances[i].Address, instances[i].HTTPPort = s.Host, s.Port
	}
	e := newEnv(t, kind, services, instances)
	ctx := testContext(t, 45*time.Second)

	t.Run("streamable Go client", func(t *testing.T) {
		hc, rec := newRecordingClient(t)
		cs, err := connectStreamable(ctx, "example", e.URL, hc, v20250618)
		if err != nil {
			t.Fatal(err)
		}
		closeAtEnd(t, cs)
		inst := instanceOf(cs.ID(), []string{"tools-1", "tools-2", "tools-3"})
		if inst == "" {
			t.Fatalf("session %q not issued by a tools replica", cs.ID())
		}
		for _, tool := range []string{"whoami", "roots"} {
			if r, err := call(ctx, cs, tool); err != nil || r.Instance != inst || r.Session != cs.ID() {
				t.Errorf("%s = %+v, %v; want %s in %s", tool, r, err, inst, cs.ID())
			}
		}
		for _, x := range rec.exchanges() {
			if x.Session == cs.ID() && x.Instance != inst {
				t.Errorf("%s %s with the session answered by %q, want %q", x.Method, x.URI, x.Instance, inst)
			}
		}
		if s, err := e.session("tools", cs.ID()); err != nil || s.Instance != inst {
			t.Errorf("binding %+v, %v; want %s", s, err, inst)
		}
	})
	t.Run("streamable TS client", func(t *testing.T) {
		skipUnlessTS(t)
		events, err := mcpts.RunClient(ctx, mcpts.ClientConfig{URL: e.URL + "/mcp", Transport: "streamable", Calls: 2, Roots: true, Terminate: true})
		if err != nil {
			t.Fatalf("%v (%+v)", err, events)
		}
		sid := events[0].SessionID
		inst := instanceOf(sid, []string{"tools-1", "tools-2", "tools-3"})
		calls := tsCalls(events)
		if inst == "" || len(calls) != 3 {
			t.Fatalf("events %+v: want a tools session and 3 calls", events)
		}
		checkServed(t, "TS client", tsResults(calls), inst, sid)
		if s, err := e.session("tools", sid); err != nil || s.Instance != inst || s.Status != session.StatusTerminated {
			t.Errorf("binding %+v, %v; want Terminated on %s", s, err, inst)
		}
	})
	t.Run("SSE Go client", func(t *testing.T) {
		hc, rec := newRecordingClient(t)
		cs, err := connectSSE(ctx, "example-sse", e.URL+"/sse", hc)
		if err != nil {
			t.Fatal(err)
		}
		closeAtEnd(t, cs)
		r, err := call(ctx, cs, "whoami")
		if err != nil || !strings.HasPrefix(r.Instance, "legacy-") {
			t.Fatalf("whoami = %+v, %v; want a legacy-tools replica", r, err)
		}
		sid, inst := checkSSEExchangesN(t, rec.exchanges(), sseFlavours[0])
		if inst != r.Instance {
			t.Errorf("GET on %q, call on %q", inst, r.Instance)
		}
		if s, err := e.session("legacy-tools", sid); err != nil || s.Instance != inst || s.Kind != session.KindMCPSSE {
			t.Errorf("binding %+v, %v; want mcp-sse on %s", s, err, inst)
		}
	})
	t.Run("SSE GET with a query refused", func(t *testing.T) {
		rej := rawRequest(t, http.MethodGet, e.URL+"/sse?sessionid=x", "", "Accept", "text/event-stream")
		if rej.Status != http.StatusBadRequest || rej.Instance != "" {
			t.Errorf("GET /sse?sessionid=x = %+v, want tether's 400", rej)
		}
	})
}
