package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeStartupFailuresExitCleanly is the regression test for finding 1 of issue 14: a
// failure inside newServices (a listener's port in use, an unreadable snapshot) used to panic
// in the deferred cleanup (nil runtime), exit 2 and hide the real error. Each case runs the
// real command and wants exit 1 with the cause on stderr.
func TestServeStartupFailuresExitCleanly(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()
	snap := filepath.Join(dir, "sessions.snap")
	writeFile(t, snap, "not a snapshot at all")

	for _, tc := range []struct {
		name, config, want string
	}{
		{"ext_proc port in use",
			"apiVersion: tether/v1\nlisteners: {api: '', extProc: '" + busy.Addr().String() + "', xds: '', sip: ''}\n",
			"listeners.extProc"},
		{"sip port in use after ext_proc bound",
			"apiVersion: tether/v1\nlisteners: {api: '', extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: '" + busy.Addr().String() + "'}\n",
			"listeners.sip"},
		{"unreadable snapshot",
			"apiVersion: tether/v1\nlisteners: {api: '', extProc: 127.0.0.1:0, xds: '', sip: ''}\nstore: {snapshotPath: '" + snap + "'}\n",
			"restore sessions from " + snap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tether.yaml")
			writeFile(t, path, tc.config)
			var stdout, stderr syncBuffer
			code := func() (code int) {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("serve panicked: %v", r)
					}
				}()
				return run(context.Background(), []string{"serve", "-c", path}, &stdout, &stderr)
			}()
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}
