package deploytest

import (
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/deploy/test/render"
)

var kustomizeDir = filepath.Join(root, "deploy/kustomize")

// kustomizeCases are the kustomizations tested: the base and the HA overlay.
var kustomizeCases = []struct {
	name, dir string
	ha        bool
}{
	{"base", "base", false},
	{"ha", "overlays/ha", true},
}

// buildKustomize runs `kustomize build dir` with the kustomize API (krusty).
func buildKustomize(t *testing.T, dir string) []byte {
	t.Helper()
	y, err := render.Kustomize(filepath.Join(kustomizeDir, dir), "")
	if err != nil {
		t.Fatal(err)
	}
	return y
}

// TestKustomize builds the base and the HA overlay with kustomize's API and applies the
// chart's checks: strict decoding into Kubernetes types, the ConfigMap's tether config
// through pkg/config with the mounted files in place, ports, probes, security, and for HA
// the replicas on Redis, the PDB, the ServiceMonitor and the discovery RBAC.
func TestKustomize(t *testing.T) {
	for _, c := range kustomizeCases {
		t.Run(c.name, func(t *testing.T) {
			objs := decodeStrict(t, "kustomize "+c.name, buildKustomize(t, c.dir))
			checkManifests(t, objs, c.ha)
		})
	}
}
