package xds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/envoyvalidate"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
	"github.com/tether-dev/tether/pkg/xds/xdstest"
)

// fixture is a registry and a running ADS server on loopback, with a client connection.
type fixture struct {
	reg       *registry.Registry
	srv       *xds.Server
	addr      string
	conn      *grpc.ClientConn
	logs      *testutil.SyncBuffer
	validated atomic.Int64 // snapshots that passed envoyvalidate
}

func baseServices() []registry.Service {
	return []registry.Service{
		{Name: "web", Affinity: registry.AffinityCookie, Balancing: registry.BalanceRoundRobin, Match: registry.Match{PathPrefix: "/"}, SessionTTL: time.Hour},
		{Name: "api", Affinity: registry.AffinityHeader, Balancing: registry.BalanceLeastRequest, Match: registry.Match{Authorities: []string{"api.test"}, PathPrefix: "/"}, HeaderField: "x-session"},
	}
}

func baseInstances() []registry.Instance {
	in := func(svc, id string, port int, state registry.State) registry.Instance {
		return registry.Instance{Service: svc, ID: id, Address: "127.0.0.1", HTTPPort: port, Weight: 1, State: state}
	}
	return []registry.Instance{
		in("web", "web-1", 8081, registry.StateActive),
		in("web", "web-2", 8082, registry.StateActive),
		in("web", "web-3", 8083, registry.StateStandby),
		in("api", "api-1", 8091, registry.StateActive),
	}
}

// start runs a server for a registry holding services and instances. Every snapshot the server
// publishes must pass envoyvalidate (with tether_ext_proc declared as a bootstrap cluster).
func start(t *testing.T, services []registry.Service, instances []registry.Instance, opts ...xds.Option) *fixture {
	t.Helper()
	f := &fixture{reg: registry.New(), logs: &testutil.SyncBuffer{}}
	if err := f.reg.Apply(services, instances); err != nil {
		t.Fatal(err)
	}
	check := func(s *cache.Snapshot) error {
		if err := envoyvalidate.ValidateSnapshot(s, envoyvalidate.WithClusters(xds.ExtProcClusterName)); err != nil {
			t.Errorf("published snapshot does not validate:\n%v", err)
			return err
		}
		f.validated.Add(1)
		return nil
	}
	all := append([]xds.Option{
		xds.WithDebounce(5 * time.Millisecond),
		xds.WithLogger(slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		xds.WithSnapshotCheck(check),
	}, opts...)
	f.srv = xds.NewServer(f.reg, all...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.srv.Run(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	f.conn, err = grpc.NewClient("passthrough:///"+f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.conn.Close() })
	return f
}

func (f *fixture) watch(t *testing.T, nodeID, typeURL string, opts ...xdstest.Option) *xdstest.Watcher {
	t.Helper()
	w, err := xdstest.Watch(context.Background(), f.conn, &corev3.Node{Id: nodeID, Cluster: "test", UserAgentName: "envoy", UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: "1.40.0"}}, typeURL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// endpointsMatch reports whether the watcher holds, for every service, exactly the CLA the pure
// builder makes from the registry's current generation.
func endpointsMatch(reg *registry.Registry) func(xdstest.Update) bool {
	return func(u xdstest.Update) bool {
		snap := reg.Snapshot()
		for _, svc := range snap.Services() {
			got, ok := u.Resources[svc.Name]
			if !ok || !proto.Equal(got, xds.ClusterLoadAssignment(svc.Name, snap.Instances(svc.Name))) {
				return false
			}
		}
		return true
	}
}

// endpointStatus lists "port:HEALTH_STATUS" for every endpoint of a CLA.
func endpointStatus(m proto.Message) []string {
	cla, _ := m.(*endpointv3.ClusterLoadAssignment)
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			out = append(out, fmt.Sprintf("%d:%s", e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(), e.GetHealthStatus()))
		}
	}
	slices.Sort(out)
	return out
}

func TestADSClientFollowsRegistry(t *testing.T) {
	f := start(t, baseServices(), baseInstances())
	ctx := waitCtx(t)
	cds := f.watch(t, "envoy-1", resource.ClusterType)
	eds := f.watch(t, "envoy-1", resource.EndpointType)

	u, err := cds.Wait(ctx, func(u xdstest.Update) bool { return len(u.Resources) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"api", "web"}, slices.Sorted(maps.Keys(u.Resources))); d != "" {
		t.Fatalf("clusters (-want +got):\n%s", d)
	}
	for name, c := range u.Resources {
		want, err := xds.Cluster(mustService(t, f.reg, name), xds.Params{})
		if err != nil {
			t.Fatal(err)
		}
		diffProto(t, want, c)
	}
	u, err = eds.Wait(ctx, endpointsMatch(f.reg))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"8081:UNKNOWN", "8082:UNKNOWN", "8083:UNKNOWN"}, endpointStatus(u.Resources["web"])); d != "" {
		t.Errorf("initial web endpoints (-want +got):\n%s", d)
	}
	cdsResponses := cds.Current().Responses

	key := registry.Key{Service: "web", ID: "web-4"}
	steps := []struct {
		name   string
		change func() error
		want   []string
	}{
		{"register", func() error {
			return f.reg.Register(registry.Instance{Service: "web", ID: "web-4", Address: "127.0.0.1", HTTPPort: 8084})
		}, []string{"8081:UNKNOWN", "8082:UNKNOWN", "8083:UNKNOWN", "8084:UNKNOWN"}},
		{"health check fails", func() error { _, err := f.reg.SetHealth(key, registry.HealthUnhealthy); return err },
			[]string{"8081:UNKNOWN", "8082:UNKNOWN", "8083:UNKNOWN"}},
		{"health check passes", func() error { _, err := f.reg.SetHealth(key, registry.HealthHealthy); return err },
			[]string{"8081:UNKNOWN", "8082:UNKNOWN", "8083:UNKNOWN", "8084:HEALTHY"}},
		{"drain", func() error { return f.reg.SetState(key, registry.StateDraining) },
			[]string{"8081:UNKNOWN", "8082:UNKNOWN", "8083:UNKNOWN", "8084:DRAINING"}},
		{"deregister", func() error { return f.reg.Deregister(key) },
			[]string{"8081:UNKNOWN", "8082:UNKNOWN", "8083:UNKNOWN"}},
	}
	for _, step := range steps {
		before := eds.Current().Responses
		if err := step.change(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		u, err := eds.Wait(ctx, func(u xdstest.Update) bool {
			return u.Responses > before && slices.Equal(endpointStatus(u.Resources["web"]), step.want)
		})
		if err != nil {
			t.Fatalf("%s: %v; endpoints %v", step.name, err, endpointStatus(u.Resources["web"]))
		}
		// One instance change is one small EDS update: only the web CLA travels.
		if got := slices.Sorted(maps.Keys(u.Last)); !slices.Equal(got, []string{"web"}) {
			t.Errorf("%s: last EDS response carried %v, want only web", step.name, got)
		}
		if _, err := eds.Wait(ctx, endpointsMatch(f.reg)); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
	}
	if got := cds.Current().Responses; got != cdsResponses {
		t.Errorf("instance changes pushed %d CDS responses, want none", got-cdsResponses)
	}
	if f.validated.Load() == 0 {
		t.Error("no snapshot went through validation")
	}
}

func mustService(t *testing.T, reg *registry.Registry, name string) registry.Service {
	t.Helper()
	s, ok := reg.Snapshot().Service(name)
	if !ok {
		t.Fatalf("no service %q", name)
	}
	return s
}

func TestNoPushWithoutContentChange(t *testing.T) {
	f := start(t, baseServices(), baseInstances())
	ctx := waitCtx(t)
	cds := f.watch(t, "envoy-1", resource.ClusterType)
	eds := f.watch(t, "envoy-1", resource.EndpointType)
	if _, err := cds.Wait(ctx, func(u xdstest.Update) bool { return len(u.Resources) == 2 }); err != nil {
		t.Fatal(err)
	}
	if _, err := eds.Wait(ctx, endpointsMatch(f.reg)); err != nil {
		t.Fatal(err)
	}
	versions := func() map[string]string {
		out := map[string]string{}
		for _, n := range f.srv.Status() {
			for _, ts := range n.Types {
				out[ts.TypeURL] = ts.SentVersion + "/" + ts.AckedVersion
			}
		}
		return out
	}
	waitStatus(t, f.srv, func(st []xds.NodeStatus) bool { return len(st) == 1 && allAcked(st[0]) })
	before := versions()

	t.Run("same config applied again", func(t *testing.T) {
		gen, pubs := f.reg.Snapshot().Generation, f.srv.Stats().Publishes
		if err := f.reg.Apply(baseServices(), baseInstances()); err != nil {
			t.Fatal(err)
		}
		if f.reg.Snapshot().Generation != gen {
			t.Fatalf("registry published a generation for an identical config")
		}
		// No generation, so nothing for the server to process: the counter proves no push.
		if f.srv.Stats().Publishes != pubs || !cds.Quiet(ctx, 0) || !eds.Quiet(ctx, 0) {
			t.Error("identical config caused a push")
		}
	})
	t.Run("change Envoy does not see", func(t *testing.T) {
		svcs := baseServices()
		svcs[0].SessionTTL = 2 * time.Hour // tether-only setting
		svcs[1].SessionsPerInstance = 7
		ins := baseInstances()
		ins[0].SIPPort = 5060 // not an HTTP endpoint
		pubs := f.srv.Stats().Publishes
		if err := f.reg.Apply(svcs, ins); err != nil {
			t.Fatal(err)
		}
		gen := f.reg.Snapshot().Generation
		testutil.Eventually(t, "the server to process the generation", func() bool { return f.srv.Stats().Generation == gen })
		if f.srv.Stats().Publishes != pubs || !cds.Quiet(ctx, 0) || !eds.Quiet(ctx, 0) {
			t.Error("a change invisible to Envoy caused a push")
		}
	})
	if d := cmp.Diff(before, versions()); d != "" {
		t.Errorf("versions moved without a content change (-before +after):\n%s", d)
	}

	t.Run("cluster change re-sends its endpoints", func(t *testing.T) {
		svcs := baseServices()
		svcs[0].ConnectTimeout = 7 * time.Second
		cdsBefore, edsBefore := cds.Current().Responses, eds.Current().Responses
		if err := f.reg.Apply(svcs, baseInstances()); err != nil {
			t.Fatal(err)
		}
		if _, err := cds.Wait(ctx, func(u xdstest.Update) bool {
			c, _ := u.Resources["web"].(*clusterv3.Cluster)
			return u.Responses > cdsBefore && c.GetConnectTimeout().AsDuration() == 7*time.Second
		}); err != nil {
			t.Fatal(err)
		}
		// Envoy re-warms a changed cluster and waits for an EDS response for it.
		u, err := eds.WaitResponses(ctx, edsBefore+1)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(maps.Keys(u.Last)); !slices.Equal(got, []string{"web"}) {
			t.Errorf("re-sent endpoints %v, want web", got)
		}
	})
}

func TestDebounceCoalescesBursts(t *testing.T) {
	f := start(t, baseServices(), baseInstances(), xds.WithDebounce(150*time.Millisecond))
	ctx := waitCtx(t)
	eds := f.watch(t, "envoy-1", resource.EndpointType)
	if _, err := eds.Wait(ctx, endpointsMatch(f.reg)); err != nil {
		t.Fatal(err)
	}
	before := f.srv.Stats().Publishes
	for i := range 20 {
		if err := f.reg.Register(registry.Instance{Service: "web", ID: fmt.Sprintf("burst-%02d", i), Address: "127.0.0.2", HTTPPort: 9000 + i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := eds.Wait(ctx, endpointsMatch(f.reg)); err != nil {
		t.Fatal(err)
	}
	gen := f.reg.Snapshot().Generation
	testutil.Eventually(t, "the server to process the last generation", func() bool { return f.srv.Stats().Generation == gen })
	// 20 generations in well under the window: one push (two if the burst straddled a window).
	if got := f.srv.Stats().Publishes - before; got < 1 || got > 2 {
		t.Errorf("20 registrations caused %d EDS pushes, want 1 or 2", got)
	}
}

func TestStatusACKsAndNACKs(t *testing.T) {
	f := start(t, baseServices(), baseInstances())
	ctx := waitCtx(t)
	cds := f.watch(t, "envoy-1", resource.ClusterType)
	eds := f.watch(t, "envoy-1", resource.EndpointType)
	picky := f.watch(t, "envoy-2", resource.ClusterType, xdstest.WithNack(func(res map[string]proto.Message) string {
		if _, ok := res["reject-me"]; ok {
			return "cluster reject-me: unsupported setting"
		}
		return ""
	}))
	for _, w := range []*xdstest.Watcher{cds, picky} {
		if _, err := w.Wait(ctx, func(u xdstest.Update) bool { return len(u.Resources) == 2 }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := eds.Wait(ctx, endpointsMatch(f.reg)); err != nil {
		t.Fatal(err)
	}

	svcs := append(baseServices(), registry.Service{Name: "reject-me"})
	if err := f.reg.Apply(svcs, baseInstances()); err != nil {
		t.Fatal(err)
	}
	if _, err := cds.Wait(ctx, func(u xdstest.Update) bool { return len(u.Resources) == 3 }); err != nil {
		t.Fatal(err)
	}
	pickyBefore := picky.Current()
	if _, err := picky.WaitResponses(ctx, pickyBefore.Responses+1); err != nil {
		t.Fatal(err)
	}
	if got := len(picky.Current().Resources); got != 2 {
		t.Errorf("the NACKing client applied the rejected config (%d clusters)", got)
	}

	st := waitStatus(t, f.srv, func(st []xds.NodeStatus) bool { return len(st) == 2 && st[1].LastNACK != nil && allAcked(st[0]) })
	if len(st) != 2 || st[0].ID != "envoy-1" || st[1].ID != "envoy-2" {
		t.Fatalf("status nodes = %+v", st)
	}
	one, two := st[0], st[1]
	if one.Streams != 2 || one.Cluster != "test" || one.UserAgent != "envoy/1.40.0" || one.Snapshot != xds.DefaultEnvoySnapshot || len(one.Peers) != 2 {
		t.Errorf("envoy-1 status = %+v", one)
	}
	if one.LastNACK != nil {
		t.Errorf("envoy-1 has a NACK: %+v", one.LastNACK)
	}
	types := map[string]xds.TypeStatus{}
	for _, ts := range one.Types {
		types[ts.TypeURL] = ts
	}
	cdsVersion := types[resource.ClusterType].AckedVersion
	if cdsVersion == "" || types[resource.ClusterType].SentVersion != cdsVersion || types[resource.EndpointType].AckedVersion == "" || types[resource.EndpointType].AckedAt.IsZero() {
		t.Errorf("envoy-1 types = %+v", one.Types)
	}
	nack := two.LastNACK
	if nack == nil || nack.TypeURL != resource.ClusterType || nack.Message != "cluster reject-me: unsupported setting" || nack.Version != cdsVersion {
		t.Errorf("envoy-2 NACK = %+v, want the CDS version %q rejected with the client's message", nack, cdsVersion)
	}
	if n := f.srv.Stats().NACKs; n == 0 {
		t.Errorf("Stats().NACKs = %d, want the NACKs of envoy-2 counted", n)
	}
	for _, ts := range two.Types {
		if ts.TypeURL == resource.ClusterType && ts.AckedVersion == cdsVersion {
			t.Errorf("envoy-2 counted as having ACKed the version it rejected")
		}
	}
	if logs := f.logs.String(); !strings.Contains(logs, "configuration rejected") || !strings.Contains(logs, "node=envoy-2") || !strings.Contains(logs, "unsupported setting") {
		t.Errorf("NACK not logged with node and detail:\n%s", logs)
	}

	t.Run("HTTP handler", func(t *testing.T) {
		h := f.srv.StatusHandler()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/xds/nodes", nil))
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("GET = %d %q", rec.Code, rec.Header().Get("Content-Type"))
		}
		var body struct {
			Nodes []xds.NodeStatus `json:"nodes"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if len(body.Nodes) != 2 || body.Nodes[1].LastNACK == nil || body.Nodes[1].LastNACK.Message != nack.Message {
			t.Errorf("JSON nodes = %+v", body.Nodes)
		}
		for _, raw := range []string{`"lastNack"`, `"ackedVersion"`, `"typeUrl"`, `"streams"`} {
			if !strings.Contains(rec.Body.String(), raw) {
				t.Errorf("JSON lacks %s:\n%s", raw, rec.Body.String())
			}
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/xds/nodes", nil))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("POST = %d, want 405", rec.Code)
		}
	})

	t.Run("streams close", func(t *testing.T) {
		cds.Close()
		eds.Close()
		st := waitStatus(t, f.srv, func(st []xds.NodeStatus) bool { return st[0].Streams == 0 })
		if s := st[0]; s.Streams != 0 || len(s.Peers) != 0 {
			t.Errorf("after close: %+v", s)
		}
	})
}

// waitStatus polls Status until cond holds (or 5 s pass) and returns the last status.
func waitStatus(t *testing.T, srv *xds.Server, cond func([]xds.NodeStatus) bool) []xds.NodeStatus {
	t.Helper()
	var st []xds.NodeStatus
	testutil.Poll(5*time.Second, func() bool { st = srv.Status(); return cond(st) })
	return st
}

func allAcked(s xds.NodeStatus) bool {
	if len(s.Types) < 2 {
		return false
	}
	for _, ts := range s.Types {
		if ts.AckedVersion == "" || ts.AckedVersion != ts.SentVersion {
			return false
		}
	}
	return true
}

func TestPerNodeSnapshotsAndManagedListeners(t *testing.T) {
	f := start(t, baseServices(), baseInstances(),
		xds.WithNodeParams("gateway", xds.Params{ManagedListeners: true, ListenerAddress: "127.0.0.1:10080"}))
	ctx := waitCtx(t)
	gwLDS := f.watch(t, "gateway", resource.ListenerType)
	gwRDS := f.watch(t, "gateway", resource.RouteType)
	otherLDS := f.watch(t, "sidecar", resource.ListenerType)

	u, err := gwLDS.Wait(ctx, func(u xdstest.Update) bool { return len(u.Resources) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	l, _ := u.Resources[xds.ListenerName].(*listenerv3.Listener)
	if l.GetAddress().GetSocketAddress().GetPortValue() != 10080 {
		t.Errorf("gateway listener = %v", l)
	}
	// An unknown node gets the default snapshot at once: here, with listeners not managed, an
	// empty listener set rather than no answer.
	u, err = otherLDS.WaitResponses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Resources) != 0 {
		t.Errorf("default node got listeners %v", slices.Collect(maps.Keys(u.Resources)))
	}
	if _, err := gwRDS.Wait(ctx, func(u xdstest.Update) bool { return u.Resources[xds.RouteConfigName] != nil }); err != nil {
		t.Fatal(err)
	}

	// A new service reaches the managed routes.
	svcs := append(baseServices(), registry.Service{Name: "docs", Match: registry.Match{PathPrefix: "/docs"}})
	if err := f.reg.Apply(svcs, baseInstances()); err != nil {
		t.Fatal(err)
	}
	if _, err := gwRDS.Wait(ctx, func(u xdstest.Update) bool {
		return strings.Contains(fmt.Sprint(u.Resources[xds.RouteConfigName]), `cluster:"docs"`)
	}); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, n := range f.srv.Status() {
		keys[n.ID] = n.Snapshot
	}
	if d := cmp.Diff(map[string]string{"gateway": "node/gateway", "sidecar": xds.DefaultEnvoySnapshot}, keys); d != "" {
		t.Errorf("snapshot keys (-want +got):\n%s", d)
	}
}

func TestFailedCheckKeepsPreviousConfig(t *testing.T) {
	var poison atomic.Bool
	f := start(t, baseServices(), baseInstances(), xds.WithSnapshotCheck(func(s *cache.Snapshot) error {
		if _, ok := s.GetResources(resource.ClusterType)["poison"]; ok && poison.Load() {
			return errors.New("poison is not allowed")
		}
		return envoyvalidate.ValidateSnapshot(s, envoyvalidate.WithClusters(xds.ExtProcClusterName))
	}))
	ctx := waitCtx(t)
	cds := f.watch(t, "envoy-1", resource.ClusterType)
	if _, err := cds.Wait(ctx, func(u xdstest.Update) bool { return len(u.Resources) == 2 }); err != nil {
		t.Fatal(err)
	}
	poison.Store(true)
	pubs := f.srv.Stats().Publishes
	if err := f.reg.Apply(append(baseServices(), registry.Service{Name: "poison"}), baseInstances()); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(5*time.Second, func() bool { return f.srv.Stats().LastError != nil })
	if err := f.srv.Stats().LastError; err == nil || !strings.Contains(err.Error(), "poison is not allowed") {
		t.Fatalf("LastError = %v", err)
	}
	if f.srv.Stats().Publishes != pubs || len(cds.Current().Resources) != 2 {
		t.Errorf("a snapshot that failed its check was published")
	}
	// The error is recorded as publish returns, the log line just after.
	if !testutil.Poll(5*time.Second, func() bool { return strings.Contains(f.logs.String(), "rebuild failed") }) {
		t.Errorf("failure not logged:\n%s", f.logs.String())
	}
	poison.Store(false)
	if err := f.reg.Apply(append(baseServices(), registry.Service{Name: "docs"}), baseInstances()); err != nil {
		t.Fatal(err)
	}
	if _, err := cds.Wait(ctx, func(u xdstest.Update) bool { return u.Resources["docs"] != nil }); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Stats().LastError; err != nil {
		t.Errorf("LastError after recovery = %v", err)
	}
}

func TestRunErrors(t *testing.T) {
	reg := registry.New()
	if err := reg.Apply(baseServices(), baseInstances()); err != nil {
		t.Fatal(err)
	}
	t.Run("initial snapshot refused", func(t *testing.T) {
		s := xds.NewServer(reg, xds.WithSnapshotCheck(func(*cache.Snapshot) error { return errors.New("nope") }))
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Run(context.Background(), lis); err == nil || !strings.Contains(err.Error(), "nope") {
			t.Errorf("Run = %v, want the check's error", err)
		}
	})
	t.Run("run twice", func(t *testing.T) {
		s := xds.NewServer(reg)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx, lis) }()
		testutil.Eventually(t, "the first Run to publish", func() bool { return s.Stats().Publishes > 0 })
		lis2, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lis2.Close() }()
		if err := s.Run(ctx, lis2); err == nil {
			t.Error("second Run succeeded")
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("first Run = %v", err)
		}
	})
}

// TestHealthService: the xDS listener answers grpc.health.v1 for XDSServiceName (what Envoy's
// health check of a multi-replica xDS cluster asks), SERVING while Run serves.
func TestHealthService(t *testing.T) {
	f := start(t, baseServices(), baseInstances())
	ctx := waitCtx(t)
	hc := healthpb.NewHealthClient(f.conn)
	for _, svc := range []string{xds.XDSServiceName, ""} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("Check(%q): %v", svc, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, want SERVING", svc, resp.GetStatus())
		}
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); status.Code(err) != codes.NotFound {
		t.Errorf("Check(unknown) = %v, want NotFound", err)
	}
}
