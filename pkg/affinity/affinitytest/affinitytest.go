// Package affinitytest builds real engines for tests: a registry, a memstore.Store and an
// affinity.Engine wired together (the store's OnEnd hook frees the engine's slots), sharing a
// settable clock, with both background loops running until the test ends. Other packages'
// tests (ext_proc, SIP decisions, the API) use it to get an engine in one line.
package affinitytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	tetherconfig "github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// Epoch is the time fixtures' clocks start at.
var Epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Service returns a service named name with the given affinity and the config file's defaults
// (20 sessions and 200 request slots per instance, TTL 6h, idle timeout 30m, cookie
// tether-session, header x-tether-session, SSE /sse with sessionId). Callers change fields
// on the returned value.
func Service(name string, mode registry.AffinityMode) registry.Service {
	return tetherconfig.DefaultService(name, mode)
}

// Instances returns n active instances of service with ids i1..in on 127.0.0.1, HTTP ports
// 8001.., SIP ports 5061.., weight 1.
func Instances(service string, n int) []registry.Instance {
	out := make([]registry.Instance, n)
	for i := range out {
		out[i] = registry.Instance{
			Service:  service,
			ID:       fmt.Sprintf("i%d", i+1),
			Address:  "127.0.0.1",
			HTTPPort: 8001 + i,
			SIPPort:  5061 + i,
			Weight:   1,
			State:    registry.StateActive,
		}
	}
	return out
}

// Fixture is a wired registry, store and engine.
type Fixture struct {
	Registry *registry.Registry
	Store    *memstore.Store
	Engine   *affinity.Engine
	Clock    *testutil.Clock

	mu        sync.Mutex
	scaleOuts []affinity.ScaleOut
}

type config struct {
	engineOpts []affinity.Option
	storeOpts  []memstore.Option
	restore    string
	run        bool
}

// Option configures New.
type Option func(*config)

// WithEngineOptions adds engine options (after the fixture's clock and scale-out recorder).
func WithEngineOptions(o ...affinity.Option) Option {
	return func(c *config) { c.engineOpts = append(c.engineOpts, o...) }
}

// WithStoreOptions adds store options (after the fixture's clock and OnEnd hook).
func WithStoreOptions(o ...memstore.Option) Option {
	return func(c *config) { c.storeOpts = append(c.storeOpts, o...) }
}

// WithRestore restores the store from a snapshot file before the engine is created.
func WithRestore(path string) Option { return func(c *config) { c.restore = path } }

// WithoutRun leaves the engine's and store's background loops stopped (the test calls
// Store.Reap itself; the engine still follows the registry lazily on Decide).
func WithoutRun() Option { return func(c *config) { c.run = false } }

// New builds a fixture over services and instances, with a clock at Epoch. The loops stop and
// are waited for when the test ends.
func New(t testing.TB, services []registry.Service, instances []registry.Instance, opts ...Option) *Fixture {
	t.Helper()
	cfg := config{run: true}
	for _, o := range opts {
		o(&cfg)
	}
	f := &Fixture{Registry: registry.New(), Clock: testutil.NewClock(Epoch)}
	if err := f.Registry.Apply(services, instances); err != nil {
		t.Fatalf("affinitytest: registry: %v", err)
	}
	storeOpts := append([]memstore.Option{
		memstore.WithClock(f.Clock.Now),
		memstore.WithReapInterval(5 * time.Millisecond),
	}, cfg.storeOpts...)
	f.Store = memstore.New(storeOpts...)
	if cfg.restore != "" {
		if _, err := f.Store.RestoreSnapshot(cfg.restore); err != nil {
			t.Fatalf("affinitytest: restore: %v", err)
		}
	}
	engineOpts := append([]affinity.Option{
		affinity.WithClock(f.Clock.Now),
		affinity.WithScaleOutHook(f.recordScaleOut),
		affinity.WithSweepInterval(5 * time.Millisecond),
	}, cfg.engineOpts...)
	eng, err := affinity.New(f.Registry, f.Store, engineOpts...)
	if err != nil {
		t.Fatalf("affinitytest: engine: %v", err)
	}
	f.Engine = eng
	if cfg.run {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = f.Store.Run(ctx) }()
		go func() { defer wg.Done(); _ = eng.Run(ctx) }()
		t.Cleanup(func() { cancel(); wg.Wait() })
	}
	return f
}

func (f *Fixture) recordScaleOut(s affinity.ScaleOut) {
	f.mu.Lock()
	f.scaleOuts = append(f.scaleOuts, s)
	f.mu.Unlock()
}

// ScaleOuts returns the scale-out signals emitted so far.
func (f *Fixture) ScaleOuts() []affinity.ScaleOut {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]affinity.ScaleOut(nil), f.scaleOuts...)
}

// Reap runs the store's reaper now (at the fixture clock's time).
func (f *Fixture) Reap(t testing.TB) {
	t.Helper()
	if _, _, err := f.Store.Reap(context.Background()); err != nil {
		t.Fatalf("affinitytest: reap: %v", err)
	}
}

// Usage returns, per instance id of a service, its sessions and its exchanges in flight (request
// slots and MCP stream slots together: Engine.Usage tells them apart).
func (f *Fixture) Usage(t testing.TB, service string) map[string][2]int {
	t.Helper()
	u, err := f.Engine.Usage(service)
	if err != nil {
		t.Fatalf("affinitytest: usage: %v", err)
	}
	out := map[string][2]int{}
	for _, x := range u {
		out[x.Instance.ID] = [2]int{x.Sessions, x.Requests + x.Streams}
	}
	return out
}

// HTTP returns an HTTP request; headers are name, value pairs (names lower-cased).
func HTTP(service, method, path string, headers ...string) affinity.Request {
	r := affinity.Request{Service: service, Protocol: affinity.ProtocolHTTP, Method: method, Path: path,
		Authority: "app.example", Peer: "192.0.2.1:40000", Headers: map[string][]string{}}
	for i := 0; i+1 < len(headers); i += 2 {
		n := strings.ToLower(headers[i])
		r.Headers[n] = append(r.Headers[n], headers[i+1])
	}
	return r
}

// SetCookie returns the value of cookie name among Set-Cookie headers, or "".
func SetCookie(hv []affinity.HeaderValue, name string) string {
	for _, h := range hv {
		if !strings.EqualFold(h.Name, "set-cookie") {
			continue
		}
		kv, _, _ := strings.Cut(h.Value, ";")
		if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == name {
			return v
		}
	}
	return ""
}

// HeaderOf returns the value of header name among hv, or "".
func HeaderOf(hv []affinity.HeaderValue, name string) string {
	for _, h := range hv {
		if strings.EqualFold(h.Name, name) {
			return h.Value
		}
	}
	return ""
}

// Sync waits until the engine routes by the registry's current generation (Engine.Sync): call
// it after changing the registry and before deciding on the change.
func (f *Fixture) Sync(t testing.TB) {
	t.Helper()
	if err := f.Engine.Sync(context.Background()); err != nil {
		t.Fatalf("affinitytest: sync: %v", err)
	}
}
