package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session/memstore"
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
			"apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '', extProc: '" + busy.Addr().String() + "', xds: '', sip: ''}\n",
			"listeners.extProc"},
		{"sip port in use after ext_proc bound",
			"apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '', extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: '" + busy.Addr().String() + "'}\n",
			"listeners.sip"},
		{"unreadable snapshot",
			"apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '', extProc: 127.0.0.1:0, xds: '', sip: ''}\nstore: {snapshotPath: '" + snap + "'}\n",
			"restore sessions from " + snap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tether.yaml")
			writeFile(t, path, tc.config)
			var stdout, stderr testutil.SyncBuffer
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

// TestServeCorruptSnapshot: a damaged snapshot stops startup with the cause and leaves the
// file untouched; with store.onCorruptSnapshot: moveAside serve starts empty, the file is
// renamed aside byte for byte, and the log says so at error level.
func TestServeCorruptSnapshot(t *testing.T) {
	for _, policy := range []string{"fail", "moveAside"} {
		t.Run(policy, func(t *testing.T) {
			dir := t.TempDir()
			snap := filepath.Join(dir, "sessions.snap")
			damaged := []byte("TTHRSNAP\x00\x00\x00\x02 a torn snapshot")
			if err := os.WriteFile(snap, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "tether.yaml")
			writeFile(t, path, "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '', extProc: 127.0.0.1:0, xds: '', sip: ''}\n"+
				"store: {snapshotPath: sessions.snap, onCorruptSnapshot: "+policy+"}\n")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var logs testutil.SyncBuffer
			ready := make(chan serveInfo, 1)
			done := make(chan error, 1)
			go func() {
				done <- serve(ctx, serveOptions{configPath: path, logOut: &logs, reload: make(chan os.Signal),
					ready: func(i serveInfo) { ready <- i }})
			}()
			if policy == "fail" {
				err := <-done
				if !errors.Is(err, memstore.ErrSnapshotCorrupt) || !strings.Contains(err.Error(), snap) {
					t.Fatalf("serve = %v; want ErrSnapshotCorrupt naming %s", err, snap)
				}
				if kept, rerr := os.ReadFile(snap); rerr != nil || !bytes.Equal(kept, damaged) {
					t.Fatalf("the damaged snapshot was changed or removed (%v)", rerr)
				}
				return
			}
			select {
			case <-ready:
			case err := <-done:
				t.Fatalf("serve: %v\n%s", err, logs.String())
			}
			moved, _ := filepath.Glob(snap + ".corrupt-*")
			if len(moved) != 1 {
				t.Fatalf("moved-aside files %v, want one", moved)
			}
			if kept, rerr := os.ReadFile(moved[0]); rerr != nil || !bytes.Equal(kept, damaged) {
				t.Fatalf("the moved file differs from the damaged snapshot (%v)", rerr)
			}
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "SESSIONS LOST") {
				t.Errorf("no error-level log of the lost sessions:\n%s", logs.String())
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			// The final snapshot at shutdown is a good one in its place.
			if data, err := os.ReadFile(snap); err != nil || !bytes.HasPrefix(data, []byte("TTHRSNAP")) {
				t.Errorf("no fresh snapshot after the empty start (%v)", err)
			}
		})
	}
}
