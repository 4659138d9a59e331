package prometheus_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// TestAlertRulesFireOnARealScrape: a real Prometheus server (Debian's /usr/bin/prometheus)
// scrapes a test tether's /metrics — status.Metrics over a real engine, the handler `tether
// serve` mounts — with the target labels Prometheus attaches (job, instance) and the ones the
// Prometheus Operator's relabelling adds (service, namespace, pod, container, endpoint), and
// evaluates deploy/prometheus/tether-rules.yaml with every `for:` shortened to 2s (the only
// change; the expressions and labels are the shipped ones). Both instances of web are full:
// TetherInstanceSlotsNearlyFull fires once per tether instance with its id in tether_instance,
// TetherScaleOutPending fires for web; the stored series keep tether's labels (no exported_*).
func TestAlertRulesFireOnARealScrape(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a Prometheus server")
	}
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed: run make deps (Debian package prometheus, /usr/bin/prometheus)")
	}

	// The test tether: web with 2 sessions per instance, both instances filled by the SessionAPI.
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.SessionsPerInstance = 2
	insts := affinitytest.Instances("web", 2)
	insts[0].ID, insts[1].ID = "web-1", "web-2"
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	for range 4 {
		if _, err := f.Engine.CreateSession(t.Context(), "web", affinity.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a := status.New(f.Registry, f.Engine,
		status.WithExtProc(func() *tetherv1.ExtProcStatus { return &tetherv1.ExtProcStatus{Streams: 1} }),
		status.WithXDS(func() *tetherv1.XdsStatus { return &tetherv1.XdsStatus{} }))
	mux := http.NewServeMux()
	mux.Handle("/metrics", status.NewMetrics(a, nil, nil).Handler())
	tether := httptest.NewServer(mux)
	t.Cleanup(tether.Close)
	target := strings.TrimPrefix(tether.URL, "http://")

	// The shipped rules, `for:` shortened.
	dir := t.TempDir()
	rules, err := os.ReadFile("tether-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("$1 2s"))
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
  - job_name: tether
    static_configs:
      - targets: [%q]
    # What the Prometheus Operator's ServiceMonitor relabelling attaches to every target.
    relabel_configs:
      - {target_label: namespace, replacement: shop}
      - {target_label: service, replacement: tether}
      - {target_label: pod, replacement: tether-0}
      - {target_label: container, replacement: tether}
      - {target_label: endpoint, replacement: http}
`, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	promAddr := ln.Addr().String()
	_ = ln.Close()
	var log testutil.SyncBuffer
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	prom := "http://" + promAddr

	type alert struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	}
	firing := func() map[string][]map[string]string {
		r, err := testutil.Try(http.MethodGet, prom+"/api/v1/alerts", "")
		if err != nil || r.Status != 200 {
			return nil
		}
		var body struct {
			Data struct{ Alerts []alert } `json:"data"`
		}
		if json.Unmarshal([]byte(r.Body), &body) != nil {
			return nil
		}
		out := map[string][]map[string]string{}
		for _, a := range body.Data.Alerts {
			if a.State == "firing" {
				out[a.Labels["alertname"]] = append(out[a.Labels["alertname"]], a.Labels)
			}
		}
		return out
	}
	var got map[string][]map[string]string
	testutil.EventuallyWithin(t, 90*time.Second, "the slot and scale-out alerts firing", func() bool {
		got = firing()
		return len(got["TetherInstanceSlotsNearlyFull"]) == 2 && len(got["TetherScaleOutPending"]) == 1
	})

	ids := map[string]bool{}
	for _, l := range got["TetherInstanceSlotsNearlyFull"] {
		if l["tether_service"] != "web" || l["job"] != "tether" || l["severity"] != "warning" {
			t.Errorf("TetherInstanceSlotsNearlyFull labels %v, want tether_service web, job tether, severity warning", l)
		}
		ids[l["tether_instance"]] = true
	}
	if !ids["web-1"] || !ids["web-2"] {
		t.Errorf("TetherInstanceSlotsNearlyFull fired for tether_instance %v, want web-1 and web-2", ids)
	}
	if l := got["TetherScaleOutPending"][0]; l["tether_service"] != "web" {
		t.Errorf("TetherScaleOutPending labels %v, want tether_service web", l)
	}
	for _, name := range []string{"TetherXDSPublishFailing", "TetherExtProcDown", "TetherNoCapacity"} {
		if len(got[name]) > 0 {
			t.Errorf("%s fired: %v", name, got[name])
		}
	}

	// The stored series: the target's labels beside tether's, none renamed to exported_*.
	r := testutil.Get(t, prom+"/api/v1/query?query=tether_instance_sessions")
	var q struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  []any             `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(r.Body), &q); err != nil {
		t.Fatalf("query: %v\n%s", err, r.Body)
	}
	if len(q.Data.Result) != 2 {
		t.Fatalf("tether_instance_sessions: %d series, want 2\n%s", len(q.Data.Result), r.Body)
	}
	for _, s := range q.Data.Result {
		m := s.Metric
		if m["instance"] != target || m["service"] != "tether" || m["pod"] != "tether-0" || m["tether_service"] != "web" ||
			(m["tether_instance"] != "web-1" && m["tether_instance"] != "web-2") || s.Value[1] != "2" {
			t.Errorf("stored series %v = %v; want instance %s (the target), service tether (the Operator's), tether_service web, tether_instance web-1/2, value 2", m, s.Value, target)
		}
		for k := range m {
			if strings.HasPrefix(k, "exported_") {
				t.Errorf("stored series %v: the scrape renamed a tether label to %s", m, k)
			}
		}
	}
}
