package mcpe2e

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// env is one tether deployment for a test, started by e2e.StartDataPlane in front of MCP
// replicas the test runs: registry, memstore.Store and engine on the real clock, tether's
// ext_proc and ADS servers on loopback gRPC, and a data plane in front.
type env struct {
	t  *testing.T
	fx *affinitytest.Fixture
	// URL is the data plane's base URL (http://127.0.0.1:port).
	URL string
}

// newEnv starts tether and a data plane of kind for services and instances (replicas already
// running), and waits until the data plane routes to every instance. Everything stops when the
// test ends; if the test failed, the ext_proc and harness stats and the usage of every
// service are logged first. MCPE2E_DEBUG=1 makes the harness log at debug level to stderr.
func newEnv(t *testing.T, kind e2e.Kind, services []registry.Service, instances []registry.Instance) *env {
	t.Helper()
	opts := []e2e.Option{e2e.WithFixtureOptions(
		affinitytest.WithEngineOptions(affinity.WithClock(time.Now)),
		affinitytest.WithStoreOptions(memstore.WithClock(time.Now)))}
	if os.Getenv("MCPE2E_DEBUG") != "" {
		opts = append(opts, e2e.WithHarnessOptions(envoyharness.WithLogger(
			slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))))
	}
	de := e2e.StartDataPlane(t, kind, services, instances, opts...)
	e := &env{t: t, fx: de.Fixture, URL: de.DP.URL()}
	t.Cleanup(func() { // runs before the data plane and tether stop
		if !t.Failed() {
			return
		}
		t.Logf("ext_proc stats: %+v", de.ExtProc.Stats())
		if h := de.Harness(); h != nil {
			t.Logf("harness stats: %+v", h.Stats())
		}
		for _, svc := range services {
			t.Logf("usage of %s: %v", svc.Name, e.usage(svc.Name))
		}
	})
	return e
}

// usage returns [sessions, requests] per instance id of service.
func (e *env) usage(service string) map[string][2]int { return e.fx.Usage(e.t, service) }

// totals sums sessions and requests over a service's instances.
func (e *env) totals(service string) (sessions, requests int) {
	for _, u := range e.usage(service) {
		sessions += u[0]
		requests += u[1]
	}
	return sessions, requests
}

// waitSlotsFree waits (eventually, described as what) until no session or request slot of
// service is in use.
func (e *env) waitSlotsFree(service, what string) {
	e.t.Helper()
	testutil.Eventually(e.t, what, func() bool {
		s, r := e.totals(service)
		return s == 0 && r == 0
	})
}

// session returns the store's record of (service, id).
func (e *env) session(service, id string) (session.Session, error) {
	return e.fx.Store.Get(context.Background(), service, id)
}

// sessions lists every session of service in the store, in any status.
func (e *env) sessions(service string) []session.Session {
	e.t.Helper()
	var out []session.Session
	tok := ""
	for {
		page, next, err := e.fx.Engine.ListSessions(context.Background(), session.Filter{}, tok, 100)
		if err != nil {
			e.t.Fatalf("list sessions: %v", err)
		}
		for _, s := range page {
			if s.Service == service {
				out = append(out, s)
			}
		}
		if next == "" {
			return out
		}
		tok = next
	}
}
