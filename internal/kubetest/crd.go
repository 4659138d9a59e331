package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// GatewayAPIModule is the module whose CRD manifests InstallGatewayAPI installs; its version is
// the one tether's go.mod requires (tether reads its types), so the CRDs match what tether was
// built against.
const GatewayAPIModule = "sigs.k8s.io/gateway-api"

// GatewayAPICRDs are the experimental-channel CRDs InstallGatewayAPI installs (file names under
// config/crd/experimental of the module).
var GatewayAPICRDs = []string{
	"gateway.networking.k8s.io_gatewayclasses.yaml",
	"gateway.networking.k8s.io_gateways.yaml",
	"gateway.networking.k8s.io_httproutes.yaml",
}

var crdOnce sync.Map // *Server → *sync.Once-guarded result

type crdResult struct {
	once sync.Once
	err  error
}

// InstallGatewayAPI installs the Gateway API experimental-channel CRDs (GatewayAPICRDs) from the
// Go module cache (the module zip ships them; `go mod download` fetches it if needed) and waits
// until they are established. Installing on a server that has them already does nothing, so
// tests sharing a server may all call it.
func (s *Server) InstallGatewayAPI(tb testing.TB) {
	tb.Helper()
	v, _ := crdOnce.LoadOrStore(s, &crdResult{})
	r := v.(*crdResult)
	r.once.Do(func() { r.err = s.installGatewayAPI() })
	if r.err != nil {
		tb.Fatalf("kubetest: Gateway API CRDs: %v", r.err)
	}
}

// GatewayAPIDir returns the module cache directory of GatewayAPIModule at the version tether's
// go.mod requires.
func GatewayAPIDir() (string, error) { return ModuleDir(GatewayAPIModule) }

// ModuleDir returns the module cache directory of module (path, or path@version; without a
// version, the one tether's go.mod requires), downloading the module if it is not there yet.
// Tests read files that modules ship (CRD manifests) from there instead of copying them.
func ModuleDir(module string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); err == nil && jerr != nil {
		err = jerr
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w: %s %s", module, err, m.Error, stderr.String())
	}
	if m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no directory: %s", module, m.Error)
	}
	return m.Dir, nil
}

func (s *Server) installGatewayAPI() error {
	dir, err := GatewayAPIDir()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	for _, f := range GatewayAPICRDs {
		raw, err := os.ReadFile(filepath.Join(dir, "config", "crd", "experimental", f))
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(raw), "\n---") {
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			var meta struct {
				Kind     string
				Metadata struct{ Name string }
			}
			if err := json.Unmarshal(js, &meta); err != nil || meta.Kind != "CustomResourceDefinition" {
				continue
			}
			_, err = s.Do(ctx, http.MethodPost, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", js)
			if se := (*StatusError)(nil); err != nil && (!errors.As(err, &se) || se.Code != http.StatusConflict) {
				return fmt.Errorf("%s: %w", meta.Metadata.Name, err)
			}
			names = append(names, meta.Metadata.Name)
		}
	}
	for _, n := range names {
		if err := s.waitEstablished(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// waitEstablished polls the CRD until its Established condition is True (the API server then
// serves its resources; it takes a moment after creation).
func (s *Server) waitEstablished(ctx context.Context, name string) error {
	for {
		b, err := s.Do(ctx, http.MethodGet, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+name, nil)
		if err != nil {
			return err
		}
		var crd struct {
			Status struct {
				Conditions []struct{ Type, Status string }
			}
		}
		if err := json.Unmarshal(b, &crd); err != nil {
			return err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == "Established" && c.Status == "True" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond): // polling the API server's own controller
		}
	}
}
