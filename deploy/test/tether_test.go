package deploytest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// This module does not import tether's packages (so tether's dependencies never make this
// go.mod untidy, nor Helm's tether's): it builds the tether binary from the repository root and
// runs `tether validate`, as a user would.

var (
	tetherOnce sync.Once
	tetherPath string
	tetherErr  error
	tetherDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if tetherDir != "" {
		_ = os.RemoveAll(tetherDir)
	}
	os.Exit(code)
}

// tetherBinary builds ./cmd/tether once per test run.
func tetherBinary(t *testing.T) string {
	t.Helper()
	tetherOnce.Do(func() {
		tetherDir, tetherErr = os.MkdirTemp("", "deploytest-")
		if tetherErr != nil {
			return
		}
		tetherPath = filepath.Join(tetherDir, "tether")
		cmd := exec.Command("go", "build", "-o", tetherPath, "./cmd/tether")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			tetherErr = fmt.Errorf("go build ./cmd/tether: %v\n%s", err, out)
		}
	})
	if tetherErr != nil {
		t.Fatal(tetherErr)
	}
	return tetherPath
}

// validateTether runs `tether validate -c path` and fails the test with its report.
func validateTether(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command(tetherBinary(t), "validate", "-c", path).CombinedOutput()
	if err != nil {
		data, _ := os.ReadFile(path)
		t.Fatalf("tether validate -c %s: %v\n%s\n--- the config:\n%s", path, err, out, data)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("tether validate -c %s: %s", path, out)
	}
}

// tetherConfig is the part of tether's config the manifest checks look at (tether validate
// has checked the whole file).
type tetherConfig struct {
	APIVersion string `json:"apiVersion"`
	Listeners  struct {
		ExtProc string `json:"extProc"`
		XDS     string `json:"xds"`
		API     string `json:"api"`
		SIP     string `json:"sip"`

		AllowInsecure bool `json:"allowInsecure"`
	} `json:"listeners"`
	TLS struct {
		CertFile     string `json:"certFile"`
		ClientCAFile string `json:"clientCAFile"`
	} `json:"tls"`
	Store struct {
		Backend      string `json:"backend"`
		SnapshotPath string `json:"snapshotPath"`
		Redis        struct {
			Addresses    []string `json:"addresses"`
			PasswordFile string   `json:"passwordFile"`
		} `json:"redis"`
	} `json:"store"`
	Shutdown struct {
		DrainTimeout string `json:"drainTimeout"`
		Handoff      bool   `json:"handoff"`
	} `json:"shutdown"`

	// moveAway is how long Envoy may keep sending new side streams to a replica that turned
	// NOT_SERVING, read from `tether bootstrap -c` (its ext_proc cluster's health check:
	// interval × unhealthy threshold + timeout).
	moveAway time.Duration
}

// bootstrapMoveAway runs `tether bootstrap -c path` and reads the ext_proc cluster's health
// check from it.
func bootstrapMoveAway(t *testing.T, path string) time.Duration {
	t.Helper()
	// With TLS on, a bootstrap needs the CA Envoy trusts (on Envoy's host, not the pod's): a
	// copy of the config beside it names one.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if tls, _ := m["tls"].(map[string]any); tls["certFile"] != nil {
		envoy, _ := m["envoy"].(map[string]any)
		if envoy == nil {
			envoy = map[string]any{}
		}
		envoy["tls"] = map[string]any{"caFile": "/etc/envoy/tether-ca.crt"}
		m["envoy"] = envoy
		b, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(filepath.Dir(path), "bootstrap-"+filepath.Base(path))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(tetherBinary(t), "bootstrap", "-c", path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tether bootstrap -c %s: %v\n%s", path, err, stderr.String())
	}
	var b struct {
		StaticResources struct {
			Clusters []struct {
				Name         string `json:"name"`
				HealthChecks []struct {
					Timeout            string `json:"timeout"`
					Interval           string `json:"interval"`
					UnhealthyThreshold int    `json:"unhealthy_threshold"`
				} `json:"health_checks"`
			} `json:"clusters"`
		} `json:"static_resources"`
	}
	if err := yaml.Unmarshal(out, &b); err != nil {
		t.Fatalf("tether bootstrap output: %v", err)
	}
	for _, c := range b.StaticResources.Clusters {
		if c.Name != "tether_ext_proc" || len(c.HealthChecks) != 1 {
			continue
		}
		hc := c.HealthChecks[0]
		iv, err1 := time.ParseDuration(hc.Interval)
		to, err2 := time.ParseDuration(hc.Timeout)
		if err1 != nil || err2 != nil || hc.UnhealthyThreshold < 1 {
			t.Fatalf("ext_proc health check %+v", hc)
		}
		return time.Duration(hc.UnhealthyThreshold)*iv + to
	}
	t.Fatal("the bootstrap has no health-checked tether_ext_proc cluster")
	return 0
}
