package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestServeSharedRegistry: with store.backend redis, an instance registered and drained through
// one serve's admin API is served by a second serve started afterwards from its first request
// (it loads the shared layer before serving), both keep it across a config reload, and with
// Redis down both keep it while /metrics and /v1/status say the shared layer is failing.
func TestServeSharedRegistry(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF("always"))
	port, port2 := upstreamPort(t), upstreamPort(t)
	redis := fmt.Sprintf("log: {level: debug}\nstore:\n  backend: redis\n  redis: {addresses: [%q], keyPrefix: 'fleet-test:', registryResync: 100ms}\n", srv.Addr)
	config := func(extra string) string {
		return strings.Replace(testConfig(port), "log: {level: debug}\n", redis, 1) + extra
	}
	start := func() (*served, string) {
		path := filepath.Join(t.TempDir(), "tether.yaml")
		writeFile(t, path, config(""))
		s := serveFor(t, path)
		return s, path
	}
	first, firstPath := start()
	api1 := "http://" + first.apiAddr
	if r := testutil.Do(t, "POST", api1+"/v1/services/web/instances", `{"id":"r1","address":"127.0.0.1","httpPort":9}`, wire.ClientHeader, "test", "Content-Type", "application/json"); r.Status != 201 {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	if r := testutil.Do(t, "PUT", api1+"/v1/services/web/instances/r1/state", `{"state":"INSTANCE_STATE_DRAINING"}`, wire.ClientHeader, "test", "Content-Type", "application/json"); r.Status != 200 {
		t.Fatalf("drain: %d %s", r.Status, r.Body)
	}

	second, secondPath := start()
	api2 := "http://" + second.apiAddr
	if r := testutil.Get(t, api2+"/v1/services/web/instances/r1"); r.Status != 200 || !strings.Contains(r.Body, "INSTANCE_STATE_DRAINING") {
		t.Fatalf("the second replica's first answer for r1: %d %s, want it registered and draining", r.Status, r.Body)
	}

	// A reload on both (the config gains an instance) keeps the registration.
	for _, s := range []struct {
		*served
		path string
	}{{first, firstPath}, {second, secondPath}} {
		writeFile(t, s.path, config(fmt.Sprintf("  - {id: added, address: 127.0.0.1, ports: {http: %d}}\n", port2)))
		s.reload <- syscall.SIGHUP
		waitFor(t, "the reload", func() bool {
			_, ok := s.registry.Snapshot().Instance(registry.Key{Service: "web", ID: "added"})
			return ok
		}, s.logs.String)
		if in, ok := s.registry.Snapshot().Instance(registry.Key{Service: "web", ID: "r1"}); !ok || in.State != registry.StateDraining {
			t.Fatalf("after the reload r1 = %+v (present %v), want registered and draining", in, ok)
		}
	}

	srv.Kill()
	for _, api := range []string{api1, api2} {
		waitFor(t, "the metrics say the shared layer is failing", func() bool {
			r, err := testutil.Try("GET", api+"/metrics", "")
			return err == nil && strings.Contains(r.Body, `tether_discovery_source_failing{kind="redis",source="api"} 1`)
		})
		r := testutil.Get(t, api+"/v1/status")
		if body := strings.Join(strings.Fields(r.Body), ""); !strings.Contains(body, `"name":"api","kind":"redis","synced":true,"failing":true`) {
			t.Errorf("/v1/status with Redis down does not say the api layer fails: %s", r.Body)
		}
		if r := testutil.Get(t, api+"/v1/services/web/instances/r1"); r.Status != 200 {
			t.Errorf("r1 with Redis down: %d %s, want the last known layer kept", r.Status, r.Body)
		}
	}
	srv.Restart()
	for _, api := range []string{api1, api2} {
		waitFor(t, "the metrics say the shared layer heals", func() bool {
			r, err := testutil.Try("GET", api+"/metrics", "")
			return err == nil && strings.Contains(r.Body, `tether_discovery_source_failing{kind="redis",source="api"} 0`)
		})
	}
}
