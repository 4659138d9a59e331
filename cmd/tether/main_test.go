package main

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut testutil.SyncBuffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDispatch(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // substring
		wantStderr string // substring
	}{
		{"no command", nil, 2, "", "usage: tether COMMAND"},
		{"unknown command", []string{"frob"}, 2, "", `tether: unknown command "frob"`},
		{"help", []string{"help"}, 0, "validate   check config files", ""},
		{"-h", []string{"-h"}, 0, "serve      run tether", ""},
		{"command help", []string{"validate", "-h"}, 0, "", "usage: tether validate -c FILE"},
		{"bad flag", []string{"version", "-x"}, 2, "", "flag provided but not defined: -x"},
		{"serve without -c", []string{"serve"}, 2, "", "usage: tether serve -c FILE"},
		{"serve with a missing file", []string{"serve", "-c", "/nonexistent/tether.yaml"}, 1, "", "tether serve: read config: open /nonexistent/tether.yaml: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tt.args...)
			if code != tt.wantCode || !strings.Contains(stdout, tt.wantStdout) || !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("run(%q) = %d\nstdout:\n%s\nstderr:\n%s\nwant code %d, stdout containing %q, stderr containing %q",
					tt.args, code, stdout, stderr, tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

func TestCommandTable(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range commands() {
		if c.name == "" || c.summary == "" || c.run == nil {
			t.Errorf("incomplete command %+v", c)
		}
		if seen[c.name] {
			t.Errorf("command %q listed twice", c.name)
		}
		seen[c.name] = true
	}
	for _, want := range []string{"serve", "validate", "version"} {
		if !seen[want] {
			t.Errorf("command %q missing", want)
		}
	}
}

func TestVersion(t *testing.T) {
	code, stdout, _ := runCmd(t, "version")
	want := "tether dev (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if code != 0 || stdout != want {
		t.Errorf("version = %d %q, want 0 %q", code, stdout, want)
	}
}

func TestValidate(t *testing.T) {
	const good, broken = "../../examples/quickstart/tether.yaml", "../../pkg/config/testdata/broken.yaml"
	t.Run("valid", func(t *testing.T) {
		code, stdout, stderr := runCmd(t, "validate", "-c", good)
		if code != 0 || stdout != good+": ok\n" || stderr != "" {
			t.Errorf("validate good = %d, %q, %q", code, stdout, stderr)
		}
	})
	t.Run("several files, one broken", func(t *testing.T) {
		code, stdout, stderr := runCmd(t, "validate", "-c", good, "-c", broken, good)
		if code != 1 {
			t.Errorf("exit code %d, want 1", code)
		}
		if stdout != good+": ok\n"+good+": ok\n" {
			t.Errorf("stdout = %q", stdout)
		}
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		// Every problem of the broken file (pinned in pkg/config's tests), then the summary.
		if len(lines) != 13 || lines[12] != "1 of 3 config files invalid" {
			t.Fatalf("stderr has %d lines, want 12 problems and a summary:\n%s", len(lines), stderr)
		}
		for _, want := range []string{
			broken + ":10: services[0].sessionsPerInstance: 500 is out of range 1..200",
			broken + ":15: services[0].headerFeild: unknown field (did you mean headerField?)",
		} {
			if !strings.Contains(stderr, want+"\n") {
				t.Errorf("stderr lacks %q", want)
			}
		}
	})
	t.Run("allowInsecure warns (issue 25)", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tether.yaml")
		writeFile(t, path, "apiVersion: tether/v1\nlisteners: {api: 0.0.0.0:9000, allowInsecure: true}\nauth: {allowInsecure: true}\n")
		code, stdout, stderr := runCmd(t, "validate", "-c", path)
		if code != 0 || stdout != path+": ok\n" {
			t.Errorf("validate = %d, %q, %q", code, stdout, stderr)
		}
		for _, want := range []string{path + ": warning: line 3: auth.allowInsecure: set", path + ": warning: line 2: listeners.allowInsecure: set"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
	})
	t.Run("no file", func(t *testing.T) {
		if code, _, _ := runCmd(t, "validate"); code != 2 {
			t.Errorf("exit code %d, want 2", code)
		}
	})
}
