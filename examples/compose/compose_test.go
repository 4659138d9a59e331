// Package compose holds the docker compose example; its tests check, without Docker, what can
// be checked: the Envoy bootstraps it mounts pass tether's Envoy validation and are exactly
// what `tether bootstrap` generates for the tether configs it mounts, which tether accepts.
// deploy/test loads the compose files themselves with the compose-spec loader.
package compose

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/envoyvalidate"
)

// pairs are the tether configs and the Envoy bootstraps generated from them.
var pairs = []struct{ tether, envoy string }{
	{"tether.yaml", "envoy.yaml"},
	{"tether-ha.yaml", "envoy-ha.yaml"},
}

// TestTetherConfigs loads every tether config the compose files mount, as `tether validate`
// does.
func TestTetherConfigs(t *testing.T) {
	for _, p := range pairs {
		t.Run(p.tether, func(t *testing.T) {
			if _, err := config.Load(p.tether); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEnvoyConfigs validates every Envoy bootstrap the compose files mount with
// pkg/envoyvalidate (go-control-plane types, every Any, cluster references) and checks that it
// is byte for byte what `tether bootstrap -c <tether config>` prints, so it cannot drift from
// what tether serves. Envoy itself cannot run here.
func TestEnvoyConfigs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds tether")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "tether")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tether")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, p := range pairs {
		t.Run(p.envoy, func(t *testing.T) {
			data, err := os.ReadFile(p.envoy)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(p.tether)
			if err != nil {
				t.Fatal(err)
			}
			var clusters []string // tether serves one cluster per service over CDS
			for _, s := range cfg.Services {
				clusters = append(clusters, s.Name)
			}
			if err := envoyvalidate.ValidateBootstrapYAML(data, envoyvalidate.WithClusters(clusters...)); err != nil {
				t.Errorf("%s: %v", p.envoy, err)
			}
			rel := "examples/compose/" + p.tether
			cmd := exec.Command(bin, "bootstrap", "-c", rel)
			cmd.Dir = root
			want, err := cmd.Output()
			if err != nil {
				t.Fatalf("tether bootstrap: %v", err)
			}
			if !bytes.Equal(data, want) {
				t.Errorf("%s is not `tether bootstrap -c %s`; regenerate it:\n  go run ./cmd/tether bootstrap -c %s > examples/compose/%s\n%s",
					p.envoy, rel, rel, p.envoy, firstDiff(string(want), string(data)))
			}
		})
	}
}

// firstDiff shows the first line where got differs from want.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range min(len(w), len(g)) {
		if w[i] != g[i] {
			return "line " + strconv.Itoa(i+1) + ":\n  want " + w[i] + "\n  got  " + g[i]
		}
	}
	return "lengths differ"
}
