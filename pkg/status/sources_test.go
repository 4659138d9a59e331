package status_test

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// Each instance source's state (synced, failing, last error, counts) is in the snapshot and in
// /metrics.
func TestSourcesInSnapshotAndMetrics(t *testing.T) {
	reg := registry.New()
	if err := reg.Apply([]registry.Service{{Name: "web"}}, []registry.Instance{{Service: "web", ID: "a", Address: "198.18.0.1", HTTPPort: 80}}); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpdateSource("kubernetes/web", "kubernetes", nil, []registry.Instance{
		{Service: "web", ID: "a", Address: "198.18.0.2", HTTPPort: 80}, {Service: "web", ID: "b", Address: "198.18.0.3", HTTPPort: 80},
	}); err != nil {
		t.Fatal(err)
	}
	reg.SourceFailed("kubernetes/web", "kubernetes", errors.New("watch endpointslices: connection refused"))
	a := status.New(reg, nil)
	var got []string
	for _, s := range a.Snapshot().GetSources() {
		got = append(got, s.GetName())
		if s.GetName() == "kubernetes/web" {
			if !s.GetSynced() || !s.GetFailing() || s.GetInstances() != 2 || s.GetShadowed() != 1 || s.GetErrors() != 1 ||
				s.GetLastError() != "watch endpointslices: connection refused" || s.GetLastSync() == nil || s.GetLastErrorTime() == nil {
				t.Errorf("kubernetes/web in the snapshot: %v", s)
			}
		}
	}
	if strings.Join(got, ",") != "config,api,kubernetes/web" {
		t.Errorf("sources %v, want config, api, kubernetes/web in precedence order", got)
	}
	rec := httptest.NewRecorder()
	status.NewMetrics(a, nil, nil).Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, line := range []string{
		`tether_discovery_source_failing{kind="kubernetes",source="kubernetes/web"} 1`,
		`tether_discovery_source_synced{kind="kubernetes",source="kubernetes/web"} 1`,
		`tether_discovery_source_instances{kind="kubernetes",source="kubernetes/web"} 2`,
		`tether_discovery_source_shadowed_instances{kind="kubernetes",source="kubernetes/web"} 1`,
		`tether_discovery_source_errors_total{kind="kubernetes",source="kubernetes/web"} 1`,
		`tether_discovery_source_failing{kind="file",source="config"} 0`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("metrics lack %q", line)
		}
	}
}
