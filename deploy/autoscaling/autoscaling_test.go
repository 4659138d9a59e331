// Package autoscaling_test checks the autoscaling manifests: they parse, and the metric they
// scale on is one tether exports.
package autoscaling_test

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tether-dev/tether/pkg/status/statustest"
)

func TestManifestsScaleOnTheDesiredInstancesGauge(t *testing.T) {
	names := statustest.MetricNames(t)
	if !names["tether_service_desired_instances"] {
		t.Fatal("tether does not export tether_service_desired_instances")
	}
	for _, f := range []struct{ file, kind string }{
		{"keda-scaledobject.yaml", "ScaledObject"},
		{"hpa.yaml", "HorizontalPodAutoscaler"},
		{"prometheus-adapter-rules.yaml", ""},
	} {
		b, err := os.ReadFile(f.file)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.UnmarshalStrict(b, &doc); err != nil {
			t.Fatalf("%s: %v", f.file, err)
		}
		if f.kind != "" && doc["kind"] != f.kind {
			t.Errorf("%s: kind %v, want %s", f.file, doc["kind"], f.kind)
		}
		if !strings.Contains(string(b), "tether_service_desired_instances") {
			t.Errorf("%s does not use tether_service_desired_instances", f.file)
		}
	}
}
