package main

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestInstanceRegistrationIsNoRedirect is #25 finding 4 against a running tether: through the
// admin API (write access), Envoy's admin port, the cloud metadata address, multicast,
// broadcast, link-local, the IPv4-mapped metadata address and the IPv4-mapped unspecified
// address are all refused with 400, never published, and never health-checked — the landed
// build accepted every one, published it in EDS, and health-checked ::ffff:0.0.0.0 at
// 127.0.0.1 (marking it healthy). tether's own listener ports are refused too, and an
// instance inside registry.allowedNetworks is still accepted and checked.
func TestInstanceRegistrationIsNoRedirect(t *testing.T) {
	var goodChecks, wildcardChecks atomic.Int64
	good := countingUpstream(t, "127.0.0.1:0", &goodChecks)
	// The landed build's health checker dialled ::ffff:0.0.0.0 as 127.0.0.1: a server on
	// every interface stands where it landed.
	wildcard := countingUpstream(t, "0.0.0.0:0", &wildcardChecks)

	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	writeFile(t, path, fmt.Sprintf(`apiVersion: tether/v1
listeners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: 127.0.0.1:0, sip: ''}
registry: {allowedNetworks: [127.0.0.1/32]}
services:
- name: web
  affinity: cookie
  healthCheck: {interval: 20ms, timeout: 20ms, healthyThreshold: 1, unhealthyThreshold: 3}
  instances:
  - {id: i0, address: 127.0.0.1, ports: {http: %d}}
`, good))
	info := serveFor(t, path).serveInfo
	_, apiPort, _ := net.SplitHostPort(info.apiAddr)
	_, extProcPort, _ := net.SplitHostPort(info.extProcAddr)

	for i, tc := range []struct {
		addr string
		port string
	}{
		{"127.0.0.1", "9901"},
		{"169.254.169.254", "80"},
		{"224.0.0.1", "80"},
		{"255.255.255.255", "80"},
		{"fe80::1", "80"},
		{"::ffff:169.254.169.254", "80"},
		{"::ffff:0.0.0.0", fmt.Sprint(wildcard)},
		{"127.0.0.1", apiPort},
		{"127.0.0.1", extProcPort},
		{"100.100.100.200", "80"},
		{"64:ff9b::a9fe:a9fe", "80"},
	} {
		body := fmt.Sprintf(`{"id":"evil%d","address":%q,"httpPort":%s}`, i, tc.addr, tc.port)
		r := testutil.Do(t, "POST", "http://"+info.apiAddr+"/v1/services/web/instances", body, wire.ClientHeader, "test", "Content-Type", "application/json")
		if r.Status != http.StatusBadRequest || !strings.Contains(r.Body, "refused") {
			t.Errorf("register %s port %s = %d %s, want 400 refused", tc.addr, tc.port, r.Status, r.Body)
		}
	}
	r := testutil.Do(t, "POST", "http://"+info.apiAddr+"/v1/services/web/instances",
		fmt.Sprintf(`{"id":"ok","address":"127.0.0.1","httpPort":%d}`, good), wire.ClientHeader, "test", "Content-Type", "application/json")
	if r.Status != http.StatusCreated {
		t.Errorf("register an allowed instance = %d %s, want 201", r.Status, r.Body)
	}
	waitFor(t, "the allowed instances checked", func() bool { return goodChecks.Load() >= 4 })
	for _, in := range info.registry.Snapshot().Instances("web") {
		if in.Address != "127.0.0.1" || in.HTTPPort != good {
			t.Errorf("published %s/%s at %s", in.Service, in.ID, in.HTTPAddr())
		}
	}
	if n := wildcardChecks.Load(); n != 0 {
		t.Errorf("the server behind ::ffff:0.0.0.0 got %d health checks, want 0", n)
	}
}

// countingUpstream starts an HTTP server on addr that counts its /healthz requests and returns its port.
func countingUpstream(t *testing.T, addr string, checks *atomic.Int64) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			checks.Add(1)
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}
