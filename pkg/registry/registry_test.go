package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/registry"
)

func svc(name string) registry.Service {
	return registry.Service{Name: name, Affinity: registry.AffinityCookie, Balancing: registry.BalanceRoundRobin, SessionsPerInstance: 20}
}

func inst(service, id string, port int) registry.Instance {
	return registry.Instance{Service: service, ID: id, Address: "127.0.0.1", HTTPPort: port, Weight: 1, State: registry.StateActive}
}

func key(service, id string) registry.Key { return registry.Key{Service: service, ID: id} }

func mustInstance(t *testing.T, r *registry.Registry, k registry.Key) registry.Instance {
	t.Helper()
	in, ok := r.Snapshot().Instance(k)
	if !ok {
		t.Fatalf("instance %v missing", k)
	}
	return in
}

func TestGenerationBumpsOnlyOnChange(t *testing.T) {
	r := registry.New()
	gen := func() uint64 { return r.Snapshot().Generation }
	if gen() != 0 {
		t.Fatalf("new registry at generation %d, want 0", gen())
	}
	services := []registry.Service{svc("web"), svc("api")}
	instances := []registry.Instance{inst("web", "a", 8081), inst("web", "b", 8082), inst("api", "x", 9001)}
	steps := []struct {
		name    string
		do      func() error
		wantGen uint64
	}{
		{"first apply", func() error { return r.Apply(services, instances) }, 1},
		{"same apply", func() error { return r.Apply(services, instances) }, 1},
		{"same apply, other order", func() error {
			return r.Apply([]registry.Service{svc("api"), svc("web")}, []registry.Instance{instances[2], instances[1], instances[0]})
		}, 1},
		{"health verdict", func() error { _, err := r.SetHealth(key("web", "a"), registry.HealthHealthy); return err }, 2},
		{"same health verdict", func() error { _, err := r.SetHealth(key("web", "a"), registry.HealthHealthy); return err }, 2},
		{"state", func() error { return r.SetState(key("web", "b"), registry.StateDraining) }, 3},
		{"same state", func() error { return r.SetState(key("web", "b"), registry.StateDraining) }, 3},
		{"apply keeps runtime state: nothing changes", func() error { return r.Apply(services, instances) }, 3},
		{"service setting changes", func() error {
			s := svc("web")
			s.SessionsPerInstance = 5
			return r.Apply([]registry.Service{s, svc("api")}, instances)
		}, 4},
		{"register", func() error { return r.Register(inst("api", "y", 9002)) }, 5},
		{"failed register", func() error {
			err := r.Register(inst("api", "y", 9002))
			if err == nil {
				return errors.New("Register(dup) succeeded, want ErrExists")
			}
			if !errors.Is(err, registry.ErrExists) {
				return fmt.Errorf("Register(dup) = %w, want ErrExists", err)
			}
			return nil
		}, 5},
		{"deregister", func() error { return r.Deregister(key("api", "y")) }, 6},
		{"failed apply", func() error {
			err := r.Apply(services, []registry.Instance{inst("nope", "a", 1)})
			if err == nil {
				return errors.New("Apply(unknown service) succeeded, want ErrUnknownService")
			}
			if !errors.Is(err, registry.ErrUnknownService) {
				return fmt.Errorf("Apply(unknown service) = %w, want ErrUnknownService", err)
			}
			return nil
		}, 6},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if gen() != s.wantGen {
			t.Fatalf("%s: generation %d, want %d", s.name, gen(), s.wantGen)
		}
	}
}

func TestSetHealthReportsChange(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		h    registry.Health
		want bool
	}{{registry.HealthUnknown, false}, {registry.HealthUnhealthy, true}, {registry.HealthUnhealthy, false}, {registry.HealthHealthy, true}} {
		changed, err := r.SetHealth(key("web", "a"), step.h)
		if err != nil || changed != step.want {
			t.Errorf("SetHealth(%s) = %v, %v; want %v, nil", step.h, changed, err, step.want)
		}
	}
}

func TestWatch(t *testing.T) {
	r := registry.New()
	ctx, cancel := context.WithCancel(t.Context())
	ch := r.Watch(ctx)
	if s := <-ch; s.Generation != 0 {
		t.Fatalf("first snapshot generation %d, want 0 (the current one)", s.Generation)
	}
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	// Several generations while the reader is away: it gets only the newest.
	for _, h := range []registry.Health{registry.HealthHealthy, registry.HealthUnhealthy, registry.HealthHealthy} {
		if _, err := r.SetHealth(key("web", "a"), h); err != nil {
			t.Fatal(err)
		}
	}
	s := <-ch
	if s.Generation != 4 || s != r.Snapshot() {
		t.Fatalf("after 4 changes got generation %d, want the latest (4)", s.Generation)
	}
	if got := mustInstance(t, r, key("web", "a")).Health; got != registry.HealthHealthy {
		t.Errorf("health %s, want healthy", got)
	}
	select {
	case s := <-ch:
		t.Fatalf("stale generation %d delivered after the latest", s.Generation)
	default:
	}
	// A no-op change wakes nobody.
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-ch:
		t.Fatalf("no-op apply delivered generation %d", s.Generation)
	default:
	}
	cancel()
	select {
	case _, ok := <-ch:
		for ok { // drain a generation that raced with cancel
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel not closed after ctx end")
	}
	// Changes after the watcher left must not block or panic.
	if err := r.SetState(key("web", "a"), registry.StateDraining); err != nil {
		t.Fatal(err)
	}
}

func TestApplyKeepsRuntimeState(t *testing.T) {
	r := registry.New()
	services := []registry.Service{svc("web")}
	apply := func(ins ...registry.Instance) {
		t.Helper()
		if err := r.Apply(services, ins); err != nil {
			t.Fatal(err)
		}
	}
	a, b := inst("web", "a", 8081), inst("web", "b", 8082)
	apply(a, b)
	if _, err := r.SetHealth(a.Key(), registry.HealthUnhealthy); err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(a.Key(), registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(b.Key(), registry.StateStandby); err != nil {
		t.Fatal(err)
	}

	// Reload with a changed weight: a keeps its health and its runtime state.
	a.Weight = 5
	apply(a, b)
	got := mustInstance(t, r, a.Key())
	if got.Weight != 5 || got.Health != registry.HealthUnhealthy || got.State != registry.StateDraining {
		t.Errorf("after reload a = %+v; want weight 5, unhealthy, draining", got)
	}
	// The config changes b's state (active → draining): the config wins over the runtime standby.
	b.State = registry.StateDraining
	apply(a, b)
	if got := mustInstance(t, r, b.Key()).State; got != registry.StateDraining {
		t.Errorf("config changed b's state: got %s, want draining", got)
	}
	// A runtime change after that survives a reload that leaves the configured state alone.
	if err := r.SetState(b.Key(), registry.StateActive); err != nil {
		t.Fatal(err)
	}
	apply(a, b)
	if got := mustInstance(t, r, b.Key()).State; got != registry.StateActive {
		t.Errorf("unchanged config overrode runtime state: got %s, want active", got)
	}
	// Removed and added back: a fresh instance with unknown health and its configured state.
	apply(b)
	if _, ok := r.Snapshot().Instance(a.Key()); ok {
		t.Fatal("removed instance still present")
	}
	apply(a, b)
	if got := mustInstance(t, r, a.Key()); got.Health != registry.HealthUnknown || got.State != registry.StateActive {
		t.Errorf("re-added a = %+v; want unknown health, active", got)
	}
	// Removing the service removes its instances.
	if err := r.Apply(nil, nil); err != nil {
		t.Fatal(err)
	}
	if s := r.Snapshot(); len(s.Services()) != 0 || len(s.Instances("web")) != 0 {
		t.Errorf("empty apply left %v and %v", s.Services(), s.Instances("web"))
	}
}

func TestSnapshotsAreImmutable(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "b", 2), inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	old := r.Snapshot()
	want := []registry.Instance{
		{Service: "web", ID: "a", Address: "127.0.0.1", HTTPPort: 1, Weight: 1, State: registry.StateActive, Health: registry.HealthUnknown},
		{Service: "web", ID: "b", Address: "127.0.0.1", HTTPPort: 2, Weight: 1, State: registry.StateActive, Health: registry.HealthUnknown},
	}
	if diff := cmp.Diff(want, old.Instances("web")); diff != "" {
		t.Fatalf("instances sorted by id (-want +got):\n%s", diff)
	}
	if _, err := r.SetHealth(key("web", "a"), registry.HealthUnhealthy); err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(key("web", "b"), registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(inst("web", "c", 3)); err != nil {
		t.Fatal(err)
	}
	if err := r.Deregister(key("web", "a")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, old.Instances("web")); diff != "" {
		t.Errorf("an old snapshot changed (-want +got):\n%s", diff)
	}
}

func TestErrors(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"apply duplicate service", r.Apply([]registry.Service{svc("web"), svc("web")}, nil), registry.ErrExists},
		{"apply duplicate instance", r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "a", 1), inst("web", "a", 2)}), registry.ErrExists},
		{"apply instance of unknown service", r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("api", "a", 1)}), registry.ErrUnknownService},
		{"register into unknown service", r.Register(inst("api", "a", 1)), registry.ErrUnknownService},
		{"register existing", r.Register(inst("web", "a", 9)), registry.ErrExists},
		{"register without port", r.Register(inst("web", "b", 0)), registry.ErrInvalid},
		{"register without id", r.Register(inst("web", "", 1)), registry.ErrInvalid},
		{"deregister unknown", r.Deregister(key("web", "zz")), registry.ErrUnknownInstance},
		{"set state unknown instance", r.SetState(key("web", "zz"), registry.StateActive), registry.ErrUnknownInstance},
		{"set invalid state", r.SetState(key("web", "a"), "paused"), registry.ErrInvalid},
	}
	_, healthErr := r.SetHealth(key("nope", "a"), registry.HealthHealthy)
	tests = append(tests, struct {
		name string
		err  error
		want error
	}{"set health unknown instance", healthErr, registry.ErrUnknownInstance})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, tt.want) {
				t.Errorf("err = %v, want errors.Is %v", tt.err, tt.want)
			}
		})
	}
	if g := r.Snapshot().Generation; g != 1 {
		t.Errorf("failed writes moved the generation to %d, want 1", g)
	}
}

func TestRegisterDefaults(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("sip")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(registry.Instance{Service: "sip", ID: "s1", Address: "10.0.0.1", SIPPort: 5060}); err != nil {
		t.Fatal(err)
	}
	want := registry.Instance{Service: "sip", ID: "s1", Address: "10.0.0.1", SIPPort: 5060, Weight: 1, State: registry.StateActive, Health: registry.HealthUnknown}
	if diff := cmp.Diff(want, mustInstance(t, r, key("sip", "s1"))); diff != "" {
		t.Errorf("registered instance (-want +got):\n%s", diff)
	}
}

// TestConcurrentReaders runs readers and watchers against writers that publish whole
// generations in which every instance carries the same Zone label; a reader seeing two labels
// in one snapshot, or a generation going backwards, would have seen a half-applied change.
func TestConcurrentReaders(t *testing.T) {
	r := registry.New()
	services := []registry.Service{svc("web"), svc("api")}
	config := func(round int) []registry.Instance {
		var out []registry.Instance
		for i := range 2 + round%3 {
			for _, s := range []string{"web", "api"} {
				in := inst(s, fmt.Sprintf("%s-%d", s, i), 8000+i)
				in.Zone = fmt.Sprintf("round-%d", round)
				out = append(out, in)
			}
		}
		return out
	}
	if err := r.Apply(services, config(0)); err != nil {
		t.Fatal(err)
	}
	consistent := func(s *registry.Snapshot) error {
		zone := ""
		for _, sv := range s.Services() {
			for _, in := range s.Instances(sv.Name) {
				if zone == "" {
					zone = in.Zone
				}
				if in.Zone != zone {
					return fmt.Errorf("generation %d mixes %s and %s", s.Generation, zone, in.Zone)
				}
			}
		}
		return nil
	}

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 4 { // snapshot readers
		wg.Go(func() {
			var last uint64
			for ctx.Err() == nil {
				s := r.Snapshot()
				if s.Generation < last {
					errs <- fmt.Errorf("generation went back from %d to %d", last, s.Generation)
					return
				}
				last = s.Generation
				if err := consistent(s); err != nil {
					errs <- err
					return
				}
				for _, in := range s.Instances("web") {
					if got, ok := s.Instance(in.Key()); !ok || got != in {
						errs <- fmt.Errorf("lookup of %v disagrees with the list", in.Key())
						return
					}
				}
			}
		})
	}
	for range 2 { // watchers
		wg.Go(func() {
			var last uint64
			for s := range r.Watch(ctx) {
				if s.Generation < last {
					errs <- fmt.Errorf("watch went back from %d to %d", last, s.Generation)
					return
				}
				last = s.Generation
				if err := consistent(s); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var writers sync.WaitGroup
	writers.Go(func() {
		for round := 1; round <= 300; round++ {
			if err := r.Apply(services, config(round)); err != nil {
				errs <- err
				return
			}
		}
	})
	writers.Go(func() {
		hs := []registry.Health{registry.HealthHealthy, registry.HealthUnhealthy}
		for i := range 600 {
			// The instance may be gone in this round's config; only unexpected errors count.
			if _, err := r.SetHealth(key("web", "web-0"), hs[i%2]); err != nil && !errors.Is(err, registry.ErrUnknownInstance) {
				errs <- err
				return
			}
		}
	})
	writers.Wait()
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRegisterRefusesUnspecifiedAddress: 0.0.0.0 and :: are where a server listens, not where
// Envoy can send a request (issue 14: the admin API registered 0.0.0.0).
func TestRegisterRefusesUnspecifiedAddress(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("sip")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"0.0.0.0", "::"} {
		err := r.Register(registry.Instance{Service: "sip", ID: "s1", Address: addr, SIPPort: 5060})
		if !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("Register(%s) = %v, want ErrInvalid", addr, err)
		}
	}
	if n := len(r.Snapshot().Instances("sip")); n != 0 {
		t.Errorf("%d instances registered", n)
	}
}
