package mcpe2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/mcpts"
	"github.com/tether-dev/tether/internal/mcpupstream"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/xds"
)

// messageTimeout is the ext_proc message_timeout of the data planes here (shipped default
// 500 ms): under the race detector on shared cores, 500 ms measures the machine, not tether.
const messageTimeout = 5 * time.Second

// env is one tether deployment for a test: registry, session.MemStore and engine (real clock),
// tether's ext_proc server and ADS server on loopback gRPC, and a data plane in front.
type env struct {
	t   *testing.T
	fx  *affinitytest.Fixture
	ext *extproc.Server
	dp  dataPlane
	// URL is the data plane's base URL (http://127.0.0.1:port).
	URL string
}

// dataPlane is what the scenarios need from Envoy or its stand-in: a base URL.
type dataPlane interface {
	URL() string
	Close() error
}

// replica is one upstream MCP server registered as an instance.
type replica struct {
	Name string
	Host string
	Port int
}

func goReplica(s *mcpupstream.Server) replica {
	return replica{Name: s.Name, Host: s.Host, Port: s.Port}
}

func tsReplica(s *mcpts.SSEServer) replica {
	return replica{Name: s.Name, Host: "127.0.0.1", Port: s.Port}
}

// instancesOf registers replicas as active instances of service, the instance id being the
// replica's name (so a session id's prefix, a tool result's instance and a binding agree).
func instancesOf(service string, rs ...replica) []registry.Instance {
	out := make([]registry.Instance, len(rs))
	for i, r := range rs {
		out[i] = registry.Instance{Service: service, ID: r.Name, Address: r.Host, HTTPPort: r.Port,
			Weight: 1, State: registry.StateActive}
	}
	return out
}

// mcpService returns a service with the config file's defaults for an MCP affinity mode.
func mcpService(name string, mode registry.AffinityMode, sessionsPerInstance int) registry.Service {
	s := affinitytest.Service(name, mode)
	s.SessionsPerInstance = sessionsPerInstance
	return s
}

// forEachPlane runs body once per data plane, as subtests named after e2e.Kinds(): the
// harness always, a real Envoy when ENVOY_BIN is set (skipped otherwise; make e2e-envoy runs
// the "envoy" subtests only).
func forEachPlane(t *testing.T, body func(t *testing.T, kind e2e.Kind)) {
	for _, kind := range e2e.Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			if kind == e2e.KindEnvoy && os.Getenv(e2e.EnvoyBinEnv) == "" {
				t.Skipf("%s is not set: skipping the real-Envoy variant", e2e.EnvoyBinEnv)
			}
			body(t, kind)
		})
	}
}

// newEnv starts tether and a data plane for services and instances. Everything stops when the
// test ends.
func newEnv(t *testing.T, kind e2e.Kind, services []registry.Service, instances []registry.Instance) *env {
	t.Helper()
	fx := affinitytest.New(t, services, instances,
		affinitytest.WithEngineOptions(affinity.WithClock(time.Now)),
		affinitytest.WithStoreOptions(session.WithClock(time.Now)))
	e := &env{t: t, fx: fx, ext: extproc.NewServer(fx.Engine)}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	extLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(extproc.ServerOptions()...)
	extproc.Register(g, e.ext)
	wg.Go(func() { _ = g.Serve(extLis) })
	t.Cleanup(g.Stop) // runs before the cancel above: streams end, then loops stop

	xdsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	xs := xds.NewServer(fx.Registry, xds.WithDebounce(0))
	wg.Go(func() { _ = xs.Run(ctx, xdsLis) })

	if kind == e2e.KindEnvoy {
		e.dp = startEnvoy(t, os.Getenv(e2e.EnvoyBinEnv), services, instances, extLis.Addr().String(), xdsLis.Addr().String())
	} else {
		e.dp = startHarness(t, services, instances, extLis.Addr().String(), xdsLis.Addr().String())
	}
	t.Cleanup(func() { _ = e.dp.Close() })
	e.URL = e.dp.URL()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ext_proc stats: %+v", e.ext.Stats())
			if h, ok := e.dp.(*envoyharness.Harness); ok {
				t.Logf("harness stats: %+v", h.Stats())
			}
			for _, svc := range services {
				t.Logf("usage of %s: %v", svc.Name, e.usage(svc.Name))
			}
		}
	})
	return e
}

// startHarness runs the Envoy-faithful harness with the routes tether generates and the
// cluster membership tether serves over ADS, and waits until every instance is in EDS.
func startHarness(t *testing.T, services []registry.Service, instances []registry.Instance, extAddr, xdsAddr string) dataPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x, err := envoyharness.WatchXDS(context.Background(), xdsAddr, "mcpe2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	rc, err := xds.RouteConfiguration(xds.RouteConfigName, services)
	if err != nil {
		t.Fatal(err)
	}
	vhosts, err := envoyharness.RoutesFromConfig(rc, xds.ServiceMetadataKey)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for _, in := range instances {
		want[in.Service] = append(want[in.Service], in.HTTPAddr())
	}
	if err := x.Wait(ctx, func() bool {
		for svc, addrs := range want {
			slices.Sort(addrs)
			if !slices.Equal(x.Addresses(svc), addrs) {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	opts := []envoyharness.Option{envoyharness.WithEarlyHeaderRemoval(xds.DefaultDestinationHeader),
		envoyharness.WithMessageTimeout(messageTimeout)}
	if os.Getenv("MCPE2E_DEBUG") != "" {
		opts = append(opts, envoyharness.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	}
	h, err := envoyharness.New(extAddr, x, vhosts, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// envoyProc is a real Envoy started from tether's generated bootstrap.
type envoyProc struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func (p *envoyProc) URL() string { return p.url }

func (p *envoyProc) Close() error {
	_ = p.cmd.Process.Kill()
	<-p.done
	return nil
}

// startEnvoy runs ENVOY_BIN with the bootstrap tether generates for services (static listener
// with the routes inline, CDS/EDS over ADS from xdsAddr, ext_proc at extAddr) and waits until
// Envoy is ready and every instance is in its clusters.
func startEnvoy(t *testing.T, bin string, services []registry.Service, instances []registry.Instance, extAddr, xdsAddr string) dataPlane {
	t.Helper()
	listen, admin := freePort(t), freePort(t)
	yml, err := xds.BootstrapYAML(services, xds.BootstrapParams{
		Params:         xds.Params{ListenerAddress: listen, MessageTimeout: messageTimeout},
		NodeID:         "mcpe2e",
		XDSAddress:     xdsAddr,
		ExtProcAddress: extAddr,
		AdminAddress:   admin,
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, yml, 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", cfg, "--disable-hot-restart", "-l", "warning")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &envoyProc{cmd: cmd, url: "http://" + listen, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(p.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if ready(admin, instances) {
			return p
		}
		select {
		case <-p.done:
			out, _ := os.ReadFile(filepath.Join(dir, "envoy.log"))
			t.Fatalf("envoy exited: %s", out)
		default:
		}
		if time.Now().After(deadline) {
			_ = p.Close()
			out, _ := os.ReadFile(filepath.Join(dir, "envoy.log"))
			t.Fatalf("envoy not ready within 20s: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ready asks Envoy's admin whether the server is LIVE and every instance is a cluster member.
func ready(admin string, instances []registry.Instance) bool {
	get := func(path string) string {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return ""
		}
		return string(b)
	}
	if !strings.Contains(get("/ready"), "LIVE") {
		return false
	}
	clusters := get("/clusters")
	for _, in := range instances {
		if !strings.Contains(clusters, in.Service+"::"+in.HTTPAddr()+"::") {
			return false
		}
	}
	return true
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// usage returns [sessions, requests] per instance id of service.
func (e *env) usage(service string) map[string][2]int { return e.fx.Usage(e.t, service) }

// totals sums sessions and requests over a service's instances.
func (e *env) totals(service string) (sessions, requests int) {
	for _, u := range e.usage(service) {
		sessions += u[0]
		requests += u[1]
	}
	return sessions, requests
}

// session returns the store's record of (service, id).
func (e *env) session(service, id string) (session.Session, error) {
	return e.fx.Store.Get(context.Background(), service, id)
}

// sessions lists every session of service in the store, in any status.
func (e *env) sessions(service string) []session.Session {
	e.t.Helper()
	var out []session.Session
	tok := ""
	for {
		page, next, err := e.fx.Engine.ListSessions(context.Background(), session.Filter{}, tok, 100)
		if err != nil {
			e.t.Fatalf("list sessions: %v", err)
		}
		for _, s := range page {
			if s.Service == service {
				out = append(out, s)
			}
		}
		if next == "" {
			return out
		}
		tok = next
	}
}

// eventually polls cond every 5 ms until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exchange is one HTTP exchange a client made through the data plane, as the client saw it.
type exchange struct {
	Method string
	// URI is the request's path and query.
	URI string
	// Session is the request's Mcp-Session-Id header ("" if none).
	Session string
	Status  int
	// Instance is the response's X-Instance header, set by every replica ("" for a reply
	// generated by the data plane or tether).
	Instance string
}

// recorder is an http.RoundTripper that records every exchange of one client.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	log  []exchange
}

// newRecordingClient returns an HTTP client with its own connection pool that records its
// exchanges.
func newRecordingClient(t *testing.T) (*http.Client, *recorder) {
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	rec := &recorder{next: tr}
	return &http.Client{Transport: rec}, rec
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	ex := exchange{Method: req.Method, URI: req.URL.RequestURI(), Session: req.Header.Get("Mcp-Session-Id")}
	if err == nil {
		ex.Status, ex.Instance = resp.StatusCode, resp.Header.Get(mcpupstream.InstanceHeader)
	}
	r.mu.Lock()
	r.log = append(r.log, ex)
	r.mu.Unlock()
	return resp, err
}

// exchanges returns a copy of the log.
func (r *recorder) exchanges() []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// rejection is tether's JSON error body.
type rejection struct {
	Status       int
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
	Instance     string // X-Instance of the response: must be "" (no replica answered)
}

// rawRequest sends one request through the data plane and decodes tether's error body when
// the response is JSON.
func rawRequest(t *testing.T, method, url string, body string, headers ...string) rejection {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body = http.NoBody
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := http.DefaultTransport.RoundTrip(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	out := rejection{Status: resp.StatusCode, Instance: resp.Header.Get(mcpupstream.InstanceHeader)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s %s: undecodable JSON body %q: %v", method, url, b, err)
		}
	}
	return out
}

// errNoResult means a tool call returned no structured result.
var errNoResult = errors.New("tool returned no structured content")

// decodeResult converts a tool's structured content into a WhoAmI.
func decodeResult(v any) (mcpupstream.WhoAmI, error) {
	var w mcpupstream.WhoAmI
	if v == nil {
		return w, errNoResult
	}
	b, err := json.Marshal(v)
	if err != nil {
		return w, err
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return w, fmt.Errorf("decode %s: %w", b, err)
	}
	return w, nil
}
