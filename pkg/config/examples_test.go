package config_test

import (
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/config"
)

const examplesDir = "../../examples"

// TestExamplesValidate loads every examples/**/tether*.yaml: each example shipped must be valid.
// New example directories are picked up without editing this test.
func TestExamplesValidate(t *testing.T) {
	var files []string
	err := filepath.WalkDir(examplesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ok, _ := filepath.Match("tether*.yaml", d.Name()); ok && !d.IsDir() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples found")
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if _, err := config.Load(f); err != nil {
				t.Errorf("example does not validate:\n%v", err)
			}
		})
	}
}

// TestBrokenExample pins what `tether validate` shows for testdata/broken.yaml: every problem,
// each with its line.
func TestBrokenExample(t *testing.T) {
	f := filepath.Join("testdata", "broken.yaml")
	_, err := config.Load(f)
	want := []string{
		f + `:5: listeners.api: 0.0.0.0:9000 is not a loopback address: configure auth.tokens, or set auth.allowInsecure: true to serve the API without authentication`,
		f + `:6: listeners.sip: "127.0.0.1" is not host:port`,
		f + `:10: services[0].sessionsPerInstance: 500 is out of range 1..200`,
		f + `:12: services[0].idleTimeout: 2h is longer than sessionTTL 1h`,
		f + `:14: services[0].cookie.sameSite: None needs cookie.secure: true (browsers drop SameSite=None cookies without Secure)`,
		f + `:15: services[0].headerFeild: unknown field (did you mean headerField?)`,
		f + `:18: services[0].instances[0].address: "web-1.local" is not an IP address (host names are not resolved)`,
		f + `:20: services[0].instances[1].id: duplicate instance id "web-1" (also instances[0])`,
		f + `:23: services[0].instances[1].weight: 0 is out of range 1..1000`,
		f + `:24: services[1].name: duplicate service name "web" (also services[0])`,
		f + `:27: services[1].headerField: "sid" must be 5..40 characters: a letter, then letters, digits, - or _`,
		f + `:28: services[1].hashBalanceFactor: 0.5 must be 0 (off) or at least 1`,
	}
	if diff := cmp.Diff(want, errorLines(t, err)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}
