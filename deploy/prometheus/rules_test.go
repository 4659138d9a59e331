// Package prometheus_test checks the alert rules shipped in deploy/prometheus with Prometheus'
// own promtool (Debian package prometheus, installed by .ci/deps.sh).
package prometheus_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/status"
	"github.com/tether-dev/tether/pkg/status/statustest"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if testing.Short() && os.Getenv("CI") == "" {
			t.Skip("promtool not installed (apt-get install prometheus; make deps)")
		}
		t.Fatal("promtool not installed: run make deps (Debian package prometheus)")
	}
	return p
}

// TestAlertRulesCheckAndPassTheirUnitTests runs `promtool check rules` and `promtool test
// rules` (slots > 90 % for 5 min fires only after 5 minutes and only for the full instance;
// publish failing and NACKs fire).
func TestAlertRulesCheckAndPassTheirUnitTests(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "tether-rules.yaml"}, {"test", "rules", "tether-rules.test.yaml"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var metricRe = regexp.MustCompile(`\btether_[a-z_]+`)

// TestAlertRulesNameRealMetrics: every tether_* metric the rules use is one tether exports.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	b, err := os.ReadFile("tether-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	names := statustest.MetricNames(t)
	for _, m := range metricRe.FindAllString(string(b), -1) {
		if strings.HasPrefix(m, "tether_") && strings.HasSuffix(m, "_") || m == status.LabelService || m == status.LabelInstance {
			continue // a prefix, or tether's labels
		}
		if !names[m] {
			t.Errorf("rule uses %s, which tether does not export", m)
		}
	}
}
