// Package k8stest applies tether's Helm chart and kustomize manifests to a real kube-apiserver
// (internal/kubetest) with `kubectl apply --dry-run=server`: the server's schema, defaulting
// and admission check every object, as a cluster would on install — which strict decoding
// into Go types (deploy/test) does not. The manifests come from deploy/test's cmd/render
// (Helm's and kustomize's libraries live in that module, not in tether's). No controllers,
// scheduler or kubelets run: nothing is scheduled and no image is pulled.
package k8stest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/kubetest"
)

func TestMain(m *testing.M) {
	code := kubetest.Main(m)
	if render.dir != "" {
		_ = os.RemoveAll(render.dir)
	}
	os.Exit(code)
}

const root = "../.."

// promOperator is the prometheus-operator release whose ServiceMonitor CRD is installed
// (deploy/test decodes ServiceMonitors with the same release's Go types).
const promOperator = "github.com/prometheus-operator/prometheus-operator@v0.85.0"

// render is deploy/test's cmd/render, built once for the package's tests.
var render struct {
	once     sync.Once
	dir, bin string
	err      error
}

// renderer builds deploy/test's cmd/render (once per test binary) and returns its path.
func renderer(t *testing.T) string {
	t.Helper()
	render.once.Do(func() {
		if render.dir, render.err = os.MkdirTemp("", "k8stest-"); render.err != nil {
			return
		}
		render.bin = filepath.Join(render.dir, "render")
		cmd := exec.Command("go", "build", "-o", render.bin, "./cmd/render")
		cmd.Dir = filepath.Join(root, "deploy/test")
		if out, err := cmd.CombinedOutput(); err != nil {
			render.err = fmt.Errorf("go build deploy/test/cmd/render: %w\n%s", err, out)
		}
	})
	if render.err != nil {
		t.Fatal(render.err)
	}
	return render.bin
}

// serviceMonitorCRD returns the path of prometheus-operator's ServiceMonitor CRD in the
// module cache (make deps downloads the module).
func serviceMonitorCRD(t *testing.T) string {
	t.Helper()
	dir, err := kubetest.ModuleDir(promOperator)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml")
}

// TestDryRunServer renders the chart (default and HA values) and the kustomize base and HA
// overlay into namespaces of their own and applies each with `kubectl apply --dry-run=server`
// on a real kube-apiserver with prometheus-operator's ServiceMonitor CRD installed. Every
// object must be accepted, and kubectl must report each one.
func TestDryRunServer(t *testing.T) {
	s := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	renderBin := renderer(t)

	crd := serviceMonitorCRD(t)
	if out, err := s.Kubectl(ctx, "apply", "--server-side", "-f", crd); err != nil {
		t.Fatalf("install the ServiceMonitor CRD: %v\n%s", err, out)
	}
	if out, err := s.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/servicemonitors.monitoring.coreos.com"); err != nil {
		t.Fatalf("ServiceMonitor CRD not established: %v\n%s", err, out)
	}

	for _, c := range []struct {
		name string
		args []string // render's arguments before -n
		dir  string
	}{
		{"helm-default", []string{"helm"}, "deploy/helm/tether"},
		{"helm-ha", []string{"helm", "-f", filepath.Join(root, "deploy/helm/tether/ci/ha-values.yaml")}, "deploy/helm/tether"},
		{"kustomize-base", []string{"kustomize"}, "deploy/kustomize/base"},
		{"kustomize-ha", []string{"kustomize"}, "deploy/kustomize/overlays/ha"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := s.Namespace(t, c.name)
			manifests := renderTo(ctx, t, renderBin, ns, c.args, c.dir)
			file := filepath.Join(t.TempDir(), "manifests.yaml")
			if err := os.WriteFile(file, manifests, 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := s.Kubectl(ctx, "apply", "--dry-run=server", "-n", ns, "-f", file)
			if err != nil {
				t.Fatalf("kubectl apply --dry-run=server: %v\n%s\n--- manifests:\n%s", err, out, manifests)
			}
			want := strings.Count("\n"+string(manifests), "\nkind: ")
			got := strings.Count(string(out), "(server dry run)")
			if want == 0 || got != want {
				t.Errorf("kubectl reported %d objects for %d in the manifests:\n%s", got, want, out)
			}
			t.Logf("%s", out)
		})
	}

	// The server refuses what strict decoding and the values schema let through (a pod label
	// key Kubernetes does not allow), so the dry runs above check something.
	t.Run("refused", func(t *testing.T) {
		ns := s.Namespace(t, "refused")
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("podLabels: {\"bad label!\": x}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		manifests := renderTo(ctx, t, renderBin, ns, []string{"helm", "-f", values}, "deploy/helm/tether")
		file := filepath.Join(t.TempDir(), "manifests.yaml")
		if err := os.WriteFile(file, manifests, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := s.Kubectl(ctx, "apply", "--dry-run=server", "-n", ns, "-f", file)
		if err == nil || !strings.Contains(string(out), "bad label!") {
			t.Errorf("kubectl apply --dry-run=server accepted an invalid label key (%v):\n%s", err, out)
		}
	})
}

// renderTo runs cmd/render with args (the renderer and its flags) for namespace ns and dir.
func renderTo(ctx context.Context, t *testing.T, render, ns string, args []string, dir string) []byte {
	t.Helper()
	args = append(append([]string{}, args...), "-n", ns, filepath.Join(root, dir))
	out, err := exec.CommandContext(ctx, render, args...).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("render %v: %v\n%s", args, err, stderr)
	}
	return out
}
