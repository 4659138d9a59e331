package deploytest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
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
}
