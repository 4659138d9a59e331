package registry_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"

	"github.com/tether-dev/tether/pkg/registry"
)

// sharedLayer is an in-process AdminStore: the layer several registries share (pkg/fleet keeps
// it in Redis). Every change is delivered to every registry, as change messages do.
type sharedLayer struct {
	mu    sync.Mutex
	regs  []*registry.Registry
	insts map[registry.Key]registry.Instance
	layer registry.AdminLayer
	down  error // while set, every change fails with it
}

func newSharedLayer(regs ...*registry.Registry) *sharedLayer {
	s := &sharedLayer{regs: regs, insts: map[registry.Key]registry.Instance{},
		layer: registry.AdminLayer{States: map[registry.Key]registry.StateOverride{}, Health: map[registry.Key]registry.Health{}}}
	for _, r := range regs {
		r.ShareAdmin(s)
		r.ApplyAdmin(s.layer)
	}
	return s
}

func (s *sharedLayer) change(f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return s.down
	}
	if err := f(); err != nil {
		return err
	}
	l := registry.AdminLayer{States: maps.Clone(s.layer.States), Health: maps.Clone(s.layer.Health)}
	for _, in := range s.insts {
		l.Instances = append(l.Instances, in)
	}
	for _, r := range s.regs {
		r.ApplyAdmin(l)
	}
	return nil
}

func (s *sharedLayer) Register(_ context.Context, in registry.Instance) error {
	return s.change(func() error {
		if _, ok := s.insts[in.Key()]; ok {
			return registry.ErrExists
		}
		s.insts[in.Key()] = in
		return nil
	})
}

func (s *sharedLayer) Deregister(_ context.Context, k registry.Key) error {
	return s.change(func() error {
		if _, ok := s.insts[k]; !ok {
			return registry.ErrUnknownInstance
		}
		delete(s.insts, k)
		delete(s.layer.States, k)
		delete(s.layer.Health, k)
		return nil
	})
}

func (s *sharedLayer) SetState(_ context.Context, k registry.Key, o registry.StateOverride) error {
	return s.change(func() error {
		if o.Set == o.Declared {
			delete(s.layer.States, k)
		} else {
			s.layer.States[k] = o
		}
		return nil
	})
}

func (s *sharedLayer) SetHealth(_ context.Context, k registry.Key, h registry.Health) error {
	return s.change(func() error {
		if h == registry.HealthUnknown {
			delete(s.layer.Health, k)
		} else {
			s.layer.Health[k] = h
		}
		return nil
	})
}

// TestSharedAdminLayer: with a shared admin layer, writes through either registry reach both;
// a reload keeps the layer and a state override whose layer changed the state stays in the
// shared layer without applying; a config-file instance cannot be deregistered; a failing
// store changes nothing; local verdicts stand in until the layer is read again.
func TestSharedAdminLayer(t *testing.T) {
	a, b := registry.New(), registry.New()
	for _, r := range []*registry.Registry{a, b} {
		if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "c1", 1)}); err != nil {
			t.Fatal(err)
		}
	}
	s := newSharedLayer(a, b)
	if err := a.Register(inst("web", "r1", 2)); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(inst("web", "r1", 3)); !errors.Is(err, registry.ErrExists) {
		t.Fatalf("second registration: %v, want ErrExists", err)
	}
	if err := b.SetState(key("web", "c1"), registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	if changed, err := a.SetHealth(key("web", "r1"), registry.HealthUnhealthy); err != nil || !changed {
		t.Fatalf("SetHealth = %v, %v; want changed", changed, err)
	}
	for _, r := range []*registry.Registry{a, b} {
		if in := mustInstance(t, r, key("web", "c1")); in.State != registry.StateDraining {
			t.Errorf("c1 = %+v, want draining", in)
		}
		if in := mustInstance(t, r, key("web", "r1")); in.Health != registry.HealthUnhealthy || in.HTTPPort != 2 {
			t.Errorf("r1 = %+v, want a's registration, unhealthy", in)
		}
	}

	// A reload in which the config declares c1 standby itself: the layer wins on that replica,
	// the override stays shared (and applies again once the config declares active again).
	standby := inst("web", "c1", 1)
	standby.State = registry.StateStandby
	if err := a.Apply([]registry.Service{svc("web")}, []registry.Instance{standby}); err != nil {
		t.Fatal(err)
	}
	if in := mustInstance(t, a, key("web", "c1")); in.State != registry.StateStandby {
		t.Errorf("c1 after its config changed its state = %+v, want standby", in)
	}
	if _, ok := a.Snapshot().Instance(key("web", "r1")); !ok {
		t.Error("the shared registration vanished on a reload")
	}
	if err := a.Apply([]registry.Service{svc("web")}, []registry.Instance{inst("web", "c1", 1)}); err != nil {
		t.Fatal(err)
	}
	if in := mustInstance(t, a, key("web", "c1")); in.State != registry.StateDraining {
		t.Errorf("c1 with the config back to active = %+v, want the shared drain again", in)
	}

	if err := a.Deregister(key("web", "c1")); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("deregistering a config-file instance: %v, want ErrInvalid", err)
	}

	// The store fails: the error comes back and nothing changes.
	s.mu.Lock()
	s.down = registry.ErrUnavailable
	s.mu.Unlock()
	if err := b.SetState(key("web", "r1"), registry.StateStandby); !errors.Is(err, registry.ErrUnavailable) {
		t.Errorf("SetState with the store down: %v, want ErrUnavailable", err)
	}
	if _, err := b.SetHealth(key("web", "r1"), registry.HealthHealthy); !errors.Is(err, registry.ErrUnavailable) {
		t.Errorf("SetHealth with the store down: %v, want ErrUnavailable", err)
	}
	// A local verdict stands in on b alone, until b reads the layer again.
	if changed, err := b.SetHealthLocal(key("web", "r1"), registry.HealthHealthy); err != nil || !changed {
		t.Fatalf("SetHealthLocal = %v, %v; want changed", changed, err)
	}
	if in := mustInstance(t, a, key("web", "r1")); in.Health != registry.HealthUnhealthy {
		t.Errorf("a's r1 = %+v: a local verdict of b leaked", in)
	}
	b.AdminSynced()
	if in := mustInstance(t, b, key("web", "r1")); in.Health != registry.HealthUnhealthy {
		t.Errorf("b's r1 after the layer was confirmed = %+v, want the shared unhealthy verdict", in)
	}

	s.mu.Lock()
	s.down = nil
	s.mu.Unlock()
	if err := b.Deregister(key("web", "r1")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*registry.Registry{a, b} {
		if _, ok := r.Snapshot().Instance(key("web", "r1")); ok {
			t.Error("r1 still published after its deregistration")
		}
		if st := r.Sources()[1]; st.Name != registry.LayerAPI || st.Kind != "redis" || st.Instances != 0 {
			t.Errorf("api source = %+v", st)
		}
	}
}
