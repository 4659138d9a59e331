package dcr_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
)

const (
	rulesCallID = `<user-centric-rules><sip-rules><header name="Call-ID"><exist/></header></sip-rules></user-centric-rules>`
	rulesFrom   = `<user-centric-rules><sip-rules><header name="From" return="request.From.uri.user"><exist/></header></sip-rules></user-centric-rules>`
)

// writeFile writes data and moves the modification time forward by step, so that a poll sees
// a change even on file systems with coarse timestamps.
func writeFile(t *testing.T, path, data string, step int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1_700_000_000+int64(step), 0)
	if err := os.Chtimes(path, mt, mt); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dcr.xml")
	writeFile(t, path, rulesCallID, 0)
	var (
		mu      sync.Mutex
		reloads []error
	)
	w, err := dcr.NewWatcher(path, dcr.WithOnReload(func(_ *dcr.Rules, err error) {
		mu.Lock()
		reloads = append(reloads, err)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatalf("NewWatcher: %v", err)
	}
	msg := mustSIP(t, dcrtest.Request{CallID: "cid-9", From: "<sip:zoe@example.com>"})
	keyNow := func() string {
		k, _ := w.Rules().Key(msg)
		return k
	}
	if got := keyNow(); got != "cid-9" {
		t.Fatalf("initial key = %q", got)
	}
	// A request that took the rules before a reload keeps them.
	before := w.Rules()

	// Unchanged file: nothing happens.
	if changed, err := w.Reload(); changed || err != nil {
		t.Fatalf("Reload(unchanged) = %v, %v", changed, err)
	}
	writeFile(t, path, rulesFrom, 1)
	if changed, err := w.Reload(); !changed || err != nil {
		t.Fatalf("Reload(changed) = %v, %v", changed, err)
	}
	if got := keyNow(); got != "zoe" {
		t.Errorf("key after reload = %q, want zoe", got)
	}
	if k, _ := before.Key(msg); k != "cid-9" {
		t.Errorf("old rules changed: key %q", k)
	}

	// A broken file keeps the previous rules and reports the error with its line.
	writeFile(t, path, "<user-centric-rules>\n<sip-rules>\n<nope/>\n</sip-rules></user-centric-rules>", 2)
	changed, err := w.Reload()
	var de *dcr.Error
	if changed || !errors.As(err, &de) || de.Line != 3 {
		t.Fatalf("Reload(broken) = %v, %v; want a line-3 *dcr.Error", changed, err)
	}
	if got := keyNow(); got != "zoe" {
		t.Errorf("key after broken reload = %q, want zoe (previous rules)", got)
	}
	// The broken version is not re-parsed on every poll.
	if changed, err := w.Reload(); changed || err != nil {
		t.Errorf("Reload(still broken, unchanged) = %v, %v", changed, err)
	}

	// A removed file keeps the rules; when it comes back it is loaded again.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reload(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Reload(removed) err = %v", err)
	}
	writeFile(t, path, rulesCallID, 3)
	if changed, err := w.Reload(); !changed || err != nil {
		t.Fatalf("Reload(restored) = %v, %v", changed, err)
	}
	if got := keyNow(); got != "cid-9" {
		t.Errorf("key after restore = %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reloads) != 4 || reloads[0] != nil || reloads[1] == nil || reloads[2] == nil || reloads[3] != nil {
		t.Errorf("OnReload calls = %v, want [nil, parse error, stat error, nil]", reloads)
	}
}

func TestWatcherRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dcr.xml")
	writeFile(t, path, rulesCallID, 0)
	reloaded := make(chan struct{}, 1)
	w, err := dcr.NewWatcher(path, dcr.WithInterval(5*time.Millisecond), dcr.WithOnReload(func(r *dcr.Rules, err error) {
		if err == nil {
			select {
			case reloaded <- struct{}{}:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	msg := mustSIP(t, dcrtest.Request{CallID: "cid-1", From: "<sip:yan@example.com>"})
	// Readers run concurrently with the reload (checked by -race).
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if k, ok := w.Rules().Key(msg); !ok || (k != "cid-1" && k != "yan") {
					t.Errorf("Key = %q, %v", k, ok)
					return
				}
			}
		}()
	}
	writeFile(t, path, rulesFrom, 1)
	select {
	case <-reloaded:
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s")
	}
	close(stop)
	wg.Wait()
	if k, _ := w.Rules().Key(msg); k != "yan" {
		t.Errorf("key = %q, want yan", k)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestNewWatcherErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := dcr.NewWatcher(filepath.Join(dir, "missing.xml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.xml")
	writeFile(t, bad, "<oops/>", 0)
	if _, err := dcr.NewWatcher(bad); err == nil || !strings.Contains(err.Error(), "bad.xml:1:") {
		t.Errorf("bad file: %v", err)
	}
}
