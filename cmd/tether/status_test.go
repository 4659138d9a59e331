package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/status"
)

// served is a serve running for a test (serveFor).
type served struct {
	serveInfo
	// reload delivers a SIGHUP-equivalent to serve.
	reload chan os.Signal
	logs   *testutil.SyncBuffer

	cancel  context.CancelFunc
	done    chan error
	stopped bool
	err     error
}

// stop ends serve (as SIGTERM does) and returns what it returned, or an error if it did not
// return within testutil.DefaultWait; later calls return the same.
func (s *served) stop() error {
	if !s.stopped {
		s.cancel()
		select {
		case s.err = <-s.done:
		case <-time.After(testutil.DefaultWait):
			s.err = fmt.Errorf("serve did not return %v after cancel", testutil.DefaultWait)
		}
		s.stopped = true
	}
	return s.err
}

// serveFor runs serve on the config file at path until the test ends (then it must stop
// cleanly, unless the test stopped it itself) and returns what it bound, its reload channel
// and its log.
func serveFor(t *testing.T, path string) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{reload: make(chan os.Signal, 1), logs: &testutil.SyncBuffer{}, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan serveInfo, 1)
	go func() {
		s.done <- serve(ctx, serveOptions{configPath: path, logOut: s.logs, reload: s.reload,
			ready: func(i serveInfo) { ready <- i }, shutdownTimeout: 2 * time.Second})
	}()
	select {
	case s.serveInfo = <-ready:
	case err := <-s.done:
		cancel()
		t.Fatalf("serve: %v\n%s", err, s.logs.String())
	case <-time.After(15 * time.Second):
		cancel()
		t.Fatalf("serve not ready\n%s", s.logs.String())
	}
	t.Cleanup(func() {
		if s.stopped {
			return
		}
		if err := s.stop(); err != nil {
			t.Errorf("serve: %v\n%s", err, s.logs.String())
		}
	})
	return s
}

// startServe runs serve on the config text until the test ends and returns what it bound.
func startServe(t *testing.T, cfg string) serveInfo {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tether.yaml")
	writeFile(t, path, cfg)
	return serveFor(t, path).serveInfo
}

const starToken, webToken = "star-token-0123456789", "web-token-0123456789"

// withTokens adds a "*" write token and a read token for web only.
func withTokens(cfg string) string {
	return strings.Replace(cfg, "services:\n", fmt.Sprintf(`auth:
  tokens:
  - {name: ops, token: %s, services: ["*"], access: write}
  - {name: web, token: %s, services: [web]}
services:
`, starToken, webToken), 1)
}

func getStatus(t *testing.T, c *client.Client) *tetherv1.Status {
	t.Helper()
	st := &tetherv1.Status{}
	if err := c.Call(context.Background(), http.MethodGet, "/v1/status", nil, st); err != nil {
		t.Fatal(err)
	}
	return st
}

// waitHealthy waits until the health checks found every instance healthy, so that the
// snapshot holds still between two reads.
func waitHealthy(t *testing.T, c *client.Client) {
	t.Helper()
	testutil.Eventually(t, "every instance healthy", func() bool {
		for _, svc := range getStatus(t, c).GetServices() {
			for _, in := range svc.GetInstances() {
				if in.GetHealth() != tetherv1.InstanceHealth_INSTANCE_HEALTH_HEALTHY {
					return false
				}
			}
		}
		return true
	})
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	r := testutil.Get(t, url)
	if r.Status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", r.Status, r.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(r.Body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// value returns the sample of family name whose labels are exactly labels (name, value pairs).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if !cmp.Equal(got, want) {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("/metrics has no %s%v", name, want)
	return 0
}

// statusAndMetrics reads /v1/status, scrapes /metrics, and reads /v1/status again, until the
// two status reads agree (their time aside): then the metrics were scraped while status held
// still. The xDS server publishes a registry generation after a debounce and the health checks
// run on their own, so a count can move between any two reads.
func statusAndMetrics(t *testing.T, c *client.Client, metricsURL string) (*tetherv1.Status, map[string]*dto.MetricFamily) {
	t.Helper()
	var st *tetherv1.Status
	var fams map[string]*dto.MetricFamily
	testutil.Eventually(t, "status to hold still across a /metrics scrape", func() bool {
		st = getStatus(t, c)
		fams = scrape(t, metricsURL)
		after := getStatus(t, c)
		st.Time, after.Time = nil, nil
		return proto.Equal(st, after)
	})
	return st, fams
}

// TestStatusAndMetricsAgree: with real sessions placed through the SessionAPI, every number of
// /v1/status — per instance slots, health, weight, per service desired and actual instances,
// ext_proc and xDS counters — is the number /metrics shows; the Go and process collectors
// and the decision histogram are there.
func TestStatusAndMetricsAgree(t *testing.T) {
	info := startServe(t, testConfig(upstreamPort(t), upstreamPort(t), upstreamPort(t)))
	c, err := client.New(info.apiAddr)
	if err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)
	for range 5 {
		if err := c.Call(context.Background(), http.MethodPost, "/v1/services/web/sessions", &tetherv1.CreateSessionRequest{}, &tetherv1.Session{}); err != nil {
			t.Fatal(err)
		}
	}
	// One SIP decision for a service that does not exist: a timed decision with outcome NoService.
	invite := "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1\r\n" +
		"From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\n" +
		"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
	if r := testutil.Do(t, http.MethodPost, "http://"+info.sipAddr+"/v1/sip/nosuch/decide", invite); r.Status != http.StatusNotFound {
		t.Fatalf("SIP decide on an unknown service: %d", r.Status)
	}
	st, fams := statusAndMetrics(t, c, "http://"+info.apiAddr+"/metrics")

	if len(st.GetServices()) != 1 || len(st.GetServices()[0].GetInstances()) != 3 {
		t.Fatalf("status services = %v", st.GetServices())
	}
	total := 0
	for _, svc := range st.GetServices() {
		n := svc.GetName()
		if got := value(t, fams, "tether_service_desired_instances", status.LabelService, n); got != float64(svc.GetDesiredInstances()) {
			t.Errorf("%s desired: metrics %v, status %d", n, got, svc.GetDesiredInstances())
		}
		if got := value(t, fams, "tether_service_actual_instances", status.LabelService, n); got != float64(svc.GetActualInstances()) {
			t.Errorf("%s actual: metrics %v, status %d", n, got, svc.GetActualInstances())
		}
		for _, in := range svc.GetInstances() {
			l := []string{status.LabelService, n, status.LabelInstance, in.GetId()}
			total += int(in.GetSessions())
			for name, want := range map[string]int32{
				"tether_instance_sessions":      in.GetSessions(),
				"tether_instance_session_slots": in.GetSessionCapacity(),
				"tether_instance_requests":      in.GetRequests(),
				"tether_instance_request_slots": in.GetRequestCapacity(),
				"tether_instance_weight":        int32(in.GetWeight()),
			} {
				if got := value(t, fams, name, l...); got != float64(want) {
					t.Errorf("%s %s: metrics %v, status %d", name, in.GetId(), got, want)
				}
			}
			healthy := float64(1)
			if in.GetHealth() == tetherv1.InstanceHealth_INSTANCE_HEALTH_UNHEALTHY {
				healthy = 0
			}
			if got := value(t, fams, "tether_instance_healthy", l...); got != healthy {
				t.Errorf("healthy %s: metrics %v, status %v", in.GetId(), got, in.GetHealth())
			}
			if got := value(t, fams, "tether_instance_state", append(l, "state", "active")...); got != 1 {
				t.Errorf("state %s: metrics active=%v, status %v", in.GetId(), got, in.GetState())
			}
		}
	}
	if total != 5 {
		t.Errorf("status counts %d sessions, want the 5 created", total)
	}
	e, x := st.GetExtProc(), st.GetXds()
	if e == nil || x == nil {
		t.Fatalf("status lacks ext_proc %v or xds %v", e, x)
	}
	if got := value(t, fams, "tether_extproc_decisions_total"); got != float64(e.GetDecisions()) {
		t.Errorf("decisions: metrics %v, status %d", got, e.GetDecisions())
	}
	for class, n := range e.GetRejects() {
		if got := value(t, fams, "tether_extproc_rejects_total", "class", class); got != float64(n) {
			t.Errorf("rejects %s: metrics %v, status %d", class, got, n)
		}
	}
	if len(e.GetRejects()) != 7 {
		t.Errorf("status rejects by class = %v, want every class", e.GetRejects())
	}
	if got := value(t, fams, "tether_xds_publishes_total"); got != float64(x.GetPublishes()) || got == 0 {
		t.Errorf("xds publishes: metrics %v, status %d (want > 0)", got, x.GetPublishes())
	}
	if got := value(t, fams, "tether_xds_generation"); got != float64(x.GetGeneration()) {
		t.Errorf("xds generation: metrics %v, status %d", got, x.GetGeneration())
	}
	if got := value(t, fams, "tether_xds_nacks_total"); got != float64(x.GetNacks()) {
		t.Errorf("xds nacks: metrics %v, status %d", got, x.GetNacks())
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s (Go and process collectors)", name)
		}
	}
	f := fams["tether_decision_duration_seconds"]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetHistogram().GetSampleCount() != 1 {
		t.Fatalf("/metrics lacks the decision latency histogram with the one SIP decision: %v", f)
	}
	got := map[string]string{}
	for _, l := range f.GetMetric()[0].GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	// An unknown service name is not a label value (a client chooses it): it counts as "".
	if d := cmp.Diff(map[string]string{status.LabelService: "", "affinity": "", "outcome": "NoService"}, got); d != "" {
		t.Errorf("decision histogram labels (-want +got):\n%s", d)
	}
}

// TestStatusOverGRPCMatchesHTTP: tether.v1.StatusService.GetStatus answers the snapshot
// /v1/status serves, and both refuse a token not scoped to every service.
func TestStatusOverGRPCMatchesHTTP(t *testing.T) {
	info := startServe(t, withTokens(testConfig(upstreamPort(t), upstreamPort(t))))
	c, err := client.New(info.apiAddr, client.WithToken(starToken))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Call(context.Background(), http.MethodPost, "/v1/services/web/sessions", &tetherv1.CreateSessionRequest{}, &tetherv1.Session{}); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)
	conn, err := grpc.NewClient(info.apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	sc := tetherv1.NewStatusServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := sc.GetStatus(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+starToken), &tetherv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	httpStatus := getStatus(t, c)
	// Times and the xDS node list move between the two calls; services and counters do not.
	opts := []cmp.Option{protocmp.Transform(), protocmp.IgnoreFields(&tetherv1.Status{}, "time", "xds")}
	if d := cmp.Diff(httpStatus, resp.GetStatus(), opts...); d != "" {
		t.Errorf("gRPC and HTTP snapshots differ (-http +grpc):\n%s", d)
	}
	if _, err := sc.GetStatus(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+webToken), &tetherv1.GetStatusRequest{}); err == nil {
		t.Error("a token for web alone read the whole snapshot over gRPC")
	}
	if r := testutil.Get(t, "http://"+info.apiAddr+"/v1/status", "Authorization", "Bearer "+webToken); r.Status != http.StatusForbidden {
		t.Errorf("/v1/status with the web token: %d, want 403", r.Status)
	}
}

// TestPprofNeedsTheStarToken: /debug/pprof/ answers 401 without a token, 403 with a token
// scoped to one service and 200 with the "*" token.
func TestPprofNeedsTheStarToken(t *testing.T) {
	info := startServe(t, withTokens(testConfig(upstreamPort(t))))
	base := "http://" + info.apiAddr
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/debug/pprof/", "", http.StatusUnauthorized},
		{"/debug/pprof/", webToken, http.StatusForbidden},
		{"/debug/pprof/", starToken, http.StatusOK},
		{"/debug/pprof/goroutine?debug=1", starToken, http.StatusOK},
		{"/debug/pprof/cmdline", webToken, http.StatusForbidden},
		{"/debug/pprof/cmdline", starToken, http.StatusOK},
	} {
		var h []string
		if tc.token != "" {
			h = []string{"Authorization", "Bearer " + tc.token}
		}
		r := testutil.Get(t, base+tc.path, h...)
		if r.Status != tc.want {
			t.Errorf("GET %s with %q: %d, want %d", tc.path, tc.token, r.Status, tc.want)
		}
		if tc.want == http.StatusOK && tc.path == "/debug/pprof/goroutine?debug=1" && !strings.Contains(r.Body, "goroutine profile") {
			t.Errorf("goroutine profile body: %.200s", r.Body)
		}
	}
}

// TestStatusEscapesControlSequences is the regression test for issue 25's finding 6 (raw ESC
// sequences from node ids and NACK texts reached `tether status` on the terminal): a hostile
// xDS client's id and NACK text, with a screen clear, a title change and a C1 CSI, are
// printed escaped; nothing a terminal acts on gets through.
func TestStatusEscapesControlSequences(t *testing.T) {
	evil := "envoy\x1b[2J\x1b]0;pwned\x07\u009b31m"
	st := &tetherv1.Status{Xds: &tetherv1.XdsStatus{Nodes: []*tetherv1.XdsNode{{
		Id: evil, Snapshot: "default/envoy", LastNack: &tetherv1.XdsNack{Message: "bad\r\nFAKE LINE\x1b[1A" + evil},
	}}}}
	var out strings.Builder
	if err := printStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"\x1b", "\x07", "\u009b", "\r", "\nFAKE LINE"} {
		if strings.Contains(out.String(), bad) {
			t.Errorf("output holds %q:\n%s", bad, out.String())
		}
	}
	if !strings.Contains(out.String(), `envoy\x1b[2J\x1b]0;pwned\a\u009b31m`) {
		t.Errorf("the node id is not shown escaped:\n%s", out.String())
	}
}
