// Package grafana_test checks the Grafana dashboard shipped in deploy/grafana.
package grafana_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/status"
	"github.com/tether-dev/tether/pkg/status/statustest"
)

type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	} `json:"panels"`
}

var metricRe = regexp.MustCompile(`\b(?:tether|go|process)_[a-z_]+`)

// TestDashboardParsesAndNamesRealMetrics: the JSON parses (unknown fields refused at the top
// level of panels we read), every panel has a query, and every metric a query names is one
// tether exports (histogram series by their _bucket/_count/_sum names).
func TestDashboardParsesAndNamesRealMetrics(t *testing.T) {
	b, err := os.ReadFile("tether-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) < 8 {
		t.Fatalf("dashboard %q uid %q with %d panels", d.Title, d.UID, len(d.Panels))
	}
	names := statustest.MetricNames(t)
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 || p.GridPos.W == 0 {
			t.Errorf("panel %q has no query or no size", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricRe.FindAllString(tg.Expr, -1) {
				base := m
				for _, suf := range []string{"_bucket", "_count", "_sum"} {
					base = strings.TrimSuffix(base, suf)
				}
				if m == status.LabelService || m == status.LabelInstance {
					continue // tether's labels, not metrics
				}
				if !names[m] && !names[base] {
					t.Errorf("panel %q queries %s, which tether does not export", p.Title, m)
				}
			}
		}
	}
}
