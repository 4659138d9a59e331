package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/config"
)

// FuzzParse feeds arbitrary YAML to Parse: it never panics; a failure is a config.Errors
// whose every entry names the file and a line inside it (0 for file-level problems); a
// success is deterministic (parsing again gives an equal Config) and re-validates.
func FuzzParse(f *testing.F) {
	for _, p := range []string{"../../examples/quickstart/tether.yaml", "../../examples/converged/tether.yaml",
		"../../examples/mcp/tether.yaml", "testdata/broken.yaml"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"", "apiVersion: tether/v1\n", "apiVersion: tether/v1\nservices: [{name: web, affinity: cookie, instances: [{id: a, address: 127.0.0.1, ports: {http: 1}}]}]\n",
		"a: &x {b: *x}\n", "<<: {apiVersion: tether/v1}\n", "- 1\n- 2\n", "apiVersion: tether/v1\n---\nx: 1\n",
		"apiVersion: tether/v1\nlisteners: {extProc: '0.0.0.0:1', allowInsecure: true}\ntls: {certFile: x}\n",
		"apiVersion: tether/v1\nstore: {snapshotInterval: 1e9h, onCorruptSnapshot: moveAside}\n",
	} {
		f.Add([]byte(s))
	}
	name := filepath.Join("testdata", "fuzz.yaml") // relative files it names resolve in testdata
	f.Fuzz(func(t *testing.T, data []byte) {
		// A Parse that takes seconds is a finding too: crash the worker so the fuzzer keeps
		// the input.
		watchdog := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("Parse still running after 5s on %q", data)) })
		defer watchdog.Stop()
		c, err := config.Parse(data, name)
		if err != nil {
			var errs config.Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("error %v (%T) is not a non-empty config.Errors", err, err)
			}
			// YAML breaks lines at LF, CR, CRLF, NEL, LS and PS.
			norm := strings.NewReplacer("\r\n", "\n", "\r", "\n", "\u0085", "\n", "\u2028", "\n", "\u2029", "\n").Replace(string(data))
			lines := strings.Count(norm, "\n") + 1
			for _, fe := range errs {
				if fe.Line < 0 || fe.Line > lines || !strings.HasPrefix(fe.Error(), name+":") {
					t.Fatalf("error %q: line %d outside the %d-line file or no file name", fe.Error(), fe.Line, lines)
				}
			}
			return
		}
		again, err := config.Parse(data, name)
		if err != nil || !reflect.DeepEqual(c, again) {
			t.Fatalf("parsing the same input twice differs: %v", err)
		}
	})
}
