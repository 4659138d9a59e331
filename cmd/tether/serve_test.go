package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

// upstreamPort starts a real HTTP server on loopback whose /healthz passes.
func upstreamPort(t *testing.T) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// testConfig is a config on free ports whose web service has one instance per port, checked
// every 50ms.
func testConfig(ports ...int) string {
	var b strings.Builder
	b.WriteString(`apiVersion: tether/v1
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: 127.0.0.1:0}
registry: {allowedNetworks: [127.0.0.1/32]}
log: {level: debug}
services:
- name: web
  affinity: cookie
  healthCheck: {interval: 50ms, timeout: 50ms, healthyThreshold: 1, unhealthyThreshold: 3}
  instances:
`)
	for i, p := range ports {
		fmt.Fprintf(&b, "  - {id: i%d, address: 127.0.0.1, ports: {http: %d}}\n", i, p)
	}
	return b.String()
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	r := testutil.Get(t, url)
	return r.Status, r.Body
}

// instanceIDs returns the ids of web's instances as the admin API lists them.
func instanceIDs(t *testing.T, apiAddr string) []string {
	t.Helper()
	code, body := get(t, "http://"+apiAddr+"/v1/services/web/instances")
	if code != http.StatusOK {
		t.Fatalf("instances: %d %s", code, body)
	}
	var list struct {
		Instances []struct{ ID string }
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range list.Instances {
		out = append(out, in.ID)
	}
	return out
}

// healths returns "id=health" for each instance of web in the registry.
func healths(reg *registry.Registry) []string {
	var out []string
	for _, in := range reg.Snapshot().Instances("web") {
		out = append(out, in.ID+"="+string(in.Health))
	}
	return out
}

// waitFor polls cond; on timeout it fails with what and the output of each explain func.
func waitFor(t *testing.T, what string, cond func() bool, explain ...func() string) {
	t.Helper()
	if !testutil.Poll(testutil.DefaultWait, cond) {
		var b strings.Builder
		for _, e := range explain {
			b.WriteString("\n" + e())
		}
		t.Fatalf("timed out waiting for %s%s", what, b.String())
	}
}

// TestServe runs serve in-process: it answers /healthz and /readyz, health checks reach the
// registry, a reload adds an instance and keeps the others' health, a broken file on reload
// is logged and ignored, and cancelling ctx shuts down gracefully.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	p0, p1 := upstreamPort(t), upstreamPort(t)
	writeFile(t, path, testConfig(p0))

	srv := serveFor(t, path)
	info, reload, logs := srv.serveInfo, srv.reload, srv.logs
	if info.apiAddr == "" || strings.HasSuffix(info.apiAddr, ":0") {
		t.Fatalf("api address %q: want the bound address", info.apiAddr)
	}
	base := "http://" + info.apiAddr
	for _, ep := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, base+ep); code != http.StatusOK || body != "ok\n" {
			t.Errorf("GET %s = %d %q, want 200 ok", ep, code, body)
		}
	}
	if got := instanceIDs(t, info.apiAddr); !cmp.Equal(got, []string{"i0"}) {
		t.Errorf("admin API lists %v, want [i0]", got)
	}
	waitFor(t, "i0 healthy", func() bool { return cmp.Equal(healths(info.registry), []string{"i0=healthy"}) },
		func() string { return fmt.Sprint(healths(info.registry), "\n", logs.String()) })

	// Reload adds i1; i0 keeps its health verdict, and i1 gets checked.
	writeFile(t, path, testConfig(p0, p1))
	gen := info.registry.Snapshot().Generation
	reload <- syscall.SIGHUP
	waitFor(t, "i1 added", func() bool { return len(instanceIDs(t, info.apiAddr)) == 2 })
	if got := healths(info.registry); got[0] != "i0=healthy" {
		t.Errorf("after reload %s, want i0 healthy (kept)", got[0])
	}
	waitFor(t, "i1 healthy", func() bool { return cmp.Equal(healths(info.registry), []string{"i0=healthy", "i1=healthy"}) })
	if info.registry.Snapshot().Generation <= gen {
		t.Error("reload did not publish a new generation")
	}
	waitFor(t, "change logged", func() bool { return strings.Contains(logs.String(), `change="instance web/i1 added"`) })

	// A broken file on reload: every problem logged, the running config stays.
	writeFile(t, path, strings.Replace(testConfig(p0), "  affinity: cookie\n", "  affinity: cookie\n  sessionsPerInstance: 500\n  sessionTTL: 1d\n", 1))
	reload <- syscall.SIGHUP
	waitFor(t, "rejection logged", func() bool { return strings.Contains(logs.String(), "config reload rejected") })
	for _, want := range []string{
		path + `:8: services[0].sessionsPerInstance: 500 is out of range 1..200`,
		path + `:9: services[0].sessionTTL: \"1d\" is not a duration`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if got := instanceIDs(t, info.apiAddr); len(got) != 2 {
		t.Errorf("after a rejected reload instances = %v, want both kept", got)
	}

	// Graceful shutdown.
	if err := srv.stop(); err != nil {
		t.Fatalf("serve = %v, want nil", err)
	}
	if _, err := net.DialTimeout("tcp", info.apiAddr, time.Second); err == nil {
		t.Error("api listener still accepts connections after shutdown")
	}
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Errorf("log lacks the stop message:\n%s", logs.String())
	}
}

func TestServeStartupErrors(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()

	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "apiVersion: tether/v1\nservices:\n- name: Web\n")
	inUse := filepath.Join(dir, "in-use.yaml")
	writeFile(t, inUse, "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '"+busy.Addr().String()+"', extProc: '', xds: '', sip: ''}\n")

	t.Run("invalid config", func(t *testing.T) {
		err := serve(context.Background(), serveOptions{configPath: bad, logOut: io.Discard})
		var errs config.Errors
		if !errors.As(err, &errs) || len(errs) != 1 || errs[0].Line != 3 {
			t.Errorf("serve = %v, want the config's one error on line 3", err)
		}
	})
	t.Run("address in use", func(t *testing.T) {
		err := serve(context.Background(), serveOptions{configPath: inUse, logOut: io.Discard})
		if err == nil || !strings.Contains(err.Error(), "listeners.api") || !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("serve = %v, want listeners.api: address in use", err)
		}
	})
}

// TestRunServeSignals drives the real command: `tether serve -c FILE`, a real SIGHUP to this
// process reloads the file, and ending ctx (what SIGINT/SIGTERM do in main) stops it with exit 0.
func TestRunServeSignals(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	p0, p1 := upstreamPort(t), upstreamPort(t)
	writeFile(t, path, testConfig(p0))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testutil.SyncBuffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, []string{"serve", "-c", path}, &stdout, &stderr) }()

	addrRe := regexp.MustCompile(`msg="tether serving" .*api=(127\.0\.0\.1:\d+)`)
	var apiAddr string
	waitFor(t, "serving log line", func() bool {
		if m := addrRe.FindStringSubmatch(stderr.String()); m != nil {
			apiAddr = m[1]
			return true
		}
		return false
	})
	if want := "dashboard=http://" + apiAddr + "/ui/"; !strings.Contains(stderr.String(), want) {
		t.Errorf("the serving line does not print the dashboard's URL %q:\n%s", want, stderr.String())
	}
	if got := instanceIDs(t, apiAddr); len(got) != 1 {
		t.Fatalf("instances = %v, want 1", got)
	}

	writeFile(t, path, testConfig(p0, p1))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "SIGHUP reload", func() bool { return len(instanceIDs(t, apiAddr)) == 2 })

	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d, want 0\n%s", c, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestDiffConfigs(t *testing.T) {
	parse := func(y string) *config.Config {
		t.Helper()
		c, err := config.Parse([]byte(y), "tether.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := parse(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
services:
- name: web
  instances:
  - {id: a, address: 127.0.0.1, ports: {http: 1}}
  - {id: b, address: 127.0.0.1, ports: {http: 2}}
- name: old
  match: {pathPrefix: /old}
`)
	next := parse(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
listeners: {api: 127.0.0.1:9999}
log: {format: json}
services:
- name: web
  sessionsPerInstance: 3
  instances:
  - {id: a, address: 127.0.0.1, ports: {http: 1}}
  - {id: b, address: 127.0.0.1, ports: {http: 2}, weight: 2}
  - {id: c, address: 127.0.0.1, ports: {http: 3}}
- name: new
  match: {pathPrefix: /new}
`)
	want := []string{
		"service new added",
		"service old removed",
		"service web changed",
		"instance web/b changed",
		"instance web/c added",
	}
	if diff := cmp.Diff(want, diffConfigs(old, next)); diff != "" {
		t.Errorf("diff (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"listeners", "log.format"}, restartFields(old, next)); diff != "" {
		t.Errorf("restart fields (-want +got):\n%s", diff)
	}
	if got := diffConfigs(old, old); len(got) != 0 {
		t.Errorf("diff of a config with itself = %v", got)
	}
}

// TestServeJSONLogAndLevelReload: log.format json gives one JSON object per line, and a reload
// switches the level before it applies the new config.
func TestServeJSONLogAndLevelReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	const base = "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: 127.0.0.1:0}\n"
	writeFile(t, path, base+"log: {format: json, level: info}\n")
	s := serveFor(t, path)
	writeFile(t, path, base+"log: {format: json, level: debug}\nservices: [{name: web}]\n")
	s.reload <- syscall.SIGHUP
	waitFor(t, "reload", func() bool { return strings.Contains(s.logs.String(), `"msg":"config reloaded"`) })
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		var rec struct {
			Level, Msg, Change, Component string
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if rec.Component != "" && rec.Component != "registry" {
			continue // the servers' own records; this test is about serve's
		}
		got = append(got, strings.TrimSpace(rec.Level+" "+rec.Msg+" "+rec.Change))
	}
	want := []string{
		"INFO tether serving", // no debug records while the level is info
		"INFO config change log.level debug",
		"DEBUG registry changed",
		"INFO config change service web added",
		"INFO config reloaded",
		"INFO shutting down",
		"INFO ext_proc draining: NOT_SERVING, still serving new streams while Envoy moves away",
		"INFO ext_proc drained",
		"INFO stopped",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log records (-want +got):\n%s", diff)
	}
}

func TestDashboardURL(t *testing.T) {
	for _, c := range []struct {
		addr string
		tls  bool
		want string
	}{
		{"127.0.0.1:9000", false, "http://127.0.0.1:9000/ui/"},
		{"0.0.0.0:9000", true, "https://localhost:9000/ui/"},
		{"[::]:9000", false, "http://localhost:9000/ui/"},
		{"[::1]:9000", false, "http://[::1]:9000/ui/"},
		{"", false, ""},
	} {
		if got := dashboardURL(c.addr, c.tls); got != c.want {
			t.Errorf("dashboardURL(%q, %v) = %q, want %q", c.addr, c.tls, got, c.want)
		}
	}
}
