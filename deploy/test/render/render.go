// Package render renders tether's Helm chart and kustomize manifests with Helm's and
// kustomize's own Go libraries, as `helm template` and `kustomize build` do. The deployment
// tests and cmd/render (which hands the output to tests in tether's module, such as the
// `kubectl apply --dry-run=server` test) share it.
package render

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// KubeVersion is the Kubernetes release charts are rendered for: the kube-apiserver of the
// dry-run tests.
var KubeVersion = chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}

// Helm renders the chart at chartDir as release "tether" in namespace with values (nil for
// the chart's defaults), after checking them against values.schema.json, and returns the
// manifests in template-file order (NOTES.txt left out), each document headed by its source.
func Helm(chartDir string, values map[string]any, namespace string) ([]byte, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = KubeVersion
	rv, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{
		Name: "tether", Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		if !strings.HasSuffix(n, "NOTES.txt") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var b bytes.Buffer
	for _, n := range names {
		if strings.TrimSpace(files[n]) == "" {
			continue
		}
		b.WriteString("---\n# Source: " + n + "\n" + files[n] + "\n")
	}
	return b.Bytes(), nil
}

// HelmValuesFile reads a values file for Helm.
func HelmValuesFile(path string) (map[string]any, error) {
	return chartutil.ReadValuesFile(path)
}

// HelmValues parses values YAML for Helm.
func HelmValues(y []byte) (map[string]any, error) { return chartutil.ReadValues(y) }

// Kustomize runs `kustomize build dir`; a non-empty namespace overrides the kustomization's
// (through a kustomization of its own that names dir as its one resource).
func Kustomize(dir, namespace string) ([]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	target := abs
	if namespace != "" {
		tmp, err := os.MkdirTemp("", "render-kustomize-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		rel, err := filepath.Rel(tmp, abs) // kustomize takes no absolute resource paths
		if err != nil {
			return nil, err
		}
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - %s\n", namespace, rel)
		if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o600); err != nil {
			return nil, err
		}
		target = tmp
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), target)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return rm.AsYaml()
}
