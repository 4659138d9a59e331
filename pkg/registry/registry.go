// Package registry holds tether's view of services and instances: their configuration,
// administrative state and health. Every change produces a new immutable Snapshot with a higher
// generation; watchers always see whole generations, never a half-applied change.
package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
)

// Sentinel errors, checked with errors.Is.
var (
	ErrUnknownService  = errors.New("unknown service")
	ErrUnknownInstance = errors.New("unknown instance")
	ErrExists          = errors.New("already exists")
	ErrInvalid         = errors.New("invalid")
)

// Snapshot is one immutable generation of the registry. Its slices are shared: callers must not
// modify them. A Snapshot is safe for concurrent use.
type Snapshot struct {
	Generation uint64
	services   []Service             // sorted by Name
	instances  map[string][]Instance // by service, sorted by ID
}

// Services returns all services sorted by name. The slice must not be modified.
func (s *Snapshot) Services() []Service { return s.services }

// Service returns the named service.
func (s *Snapshot) Service(name string) (Service, bool) {
	i, ok := slices.BinarySearchFunc(s.services, name, func(a Service, n string) int { return cmp.Compare(a.Name, n) })
	if !ok {
		return Service{}, false
	}
	return s.services[i], true
}

// Instances returns the service's instances sorted by id. The slice must not be modified.
func (s *Snapshot) Instances(service string) []Instance { return s.instances[service] }

// Instance returns one instance.
func (s *Snapshot) Instance(k Key) (Instance, bool) {
	list := s.instances[k.Service]
	i, ok := slices.BinarySearchFunc(list, k.ID, func(a Instance, id string) int { return cmp.Compare(a.ID, id) })
	if !ok {
		return Instance{}, false
	}
	return list[i], true
}

// Registry is the mutable holder of the current Snapshot. All methods are safe for concurrent
// use; writers are serialized, readers never block.
type Registry struct {
	log *slog.Logger

	mu       sync.Mutex // serializes writers and guards watchers and configured
	cur      atomic.Pointer[Snapshot]
	watchers map[chan *Snapshot]struct{}
	// configured remembers the state each instance had in the last applied config, so a reload
	// only overrides a runtime state change when the config itself changed that instance's state.
	configured map[Key]State
}

// Option configures a Registry.
type Option func(*Registry)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(r *Registry) { r.log = l } }

// New returns an empty registry at generation 0.
func New(opts ...Option) *Registry {
	r := &Registry{
		log:        slog.New(slog.DiscardHandler),
		watchers:   map[chan *Snapshot]struct{}{},
		configured: map[Key]State{},
	}
	for _, o := range opts {
		o(r)
	}
	r.cur.Store(&Snapshot{instances: map[string][]Instance{}})
	return r
}

// Snapshot returns the current generation.
func (r *Registry) Snapshot() *Snapshot { return r.cur.Load() }

// Watch returns a channel that receives the current snapshot at once and then every later
// generation. Delivery is latest-wins: a slow reader skips intermediate generations but always
// gets the newest. The channel is closed when ctx ends.
func (r *Registry) Watch(ctx context.Context) <-chan *Snapshot {
	ch := make(chan *Snapshot, 1)
	r.mu.Lock()
	r.watchers[ch] = struct{}{}
	ch <- r.cur.Load()
	r.mu.Unlock()
	go func() {
		<-ctx.Done()
		r.mu.Lock()
		delete(r.watchers, ch)
		close(ch)
		r.mu.Unlock()
	}()
	return ch
}

// Apply replaces the configured services and instances (a config load or reload). Instances that
// survive keep their health; their state is kept too unless the config changed it. Instances whose
// service is missing are rejected. Apply publishes a new generation only if something changed.
func (r *Registry) Apply(services []Service, instances []Instance) error {
	svcs := slices.Clone(services)
	slices.SortFunc(svcs, func(a, b Service) int { return cmp.Compare(a.Name, b.Name) })
	for i := 1; i < len(svcs); i++ {
		if svcs[i].Name == svcs[i-1].Name {
			return fmt.Errorf("service %q: %w", svcs[i].Name, ErrExists)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	next := map[string][]Instance{}
	configured := map[Key]State{}
	for _, in := range instances {
		if _, ok := slices.BinarySearchFunc(svcs, in.Service, func(a Service, n string) int { return cmp.Compare(a.Name, n) }); !ok {
			return fmt.Errorf("instance %q: service %q: %w", in.ID, in.Service, ErrUnknownService)
		}
		if _, dup := configured[in.Key()]; dup {
			return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, ErrExists)
		}
		configured[in.Key()] = in.State
		if prev, ok := old.Instance(in.Key()); ok {
			in.Health = prev.Health
			if r.configured[in.Key()] == in.State {
				in.State = prev.State
			}
		}
		if in.Health == "" {
			in.Health = HealthUnknown
		}
		next[in.Service] = append(next[in.Service], in)
	}
	for _, list := range next {
		slices.SortFunc(list, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
	}
	r.configured = configured
	r.publishLocked(svcs, next)
	return nil
}

// SetHealth records a health verdict. It reports whether the instance's health changed.
func (r *Registry) SetHealth(k Key, h Health) (bool, error) {
	changed := false
	err := r.updateInstance(k, func(in *Instance) error {
		changed = in.Health != h
		in.Health = h
		return nil
	})
	return changed, err
}

// SetState sets an instance's administrative state.
func (r *Registry) SetState(k Key, s State) error {
	switch s {
	case StateActive, StateStandby, StateDraining:
	default:
		return fmt.Errorf("state %q: %w", s, ErrInvalid)
	}
	return r.updateInstance(k, func(in *Instance) error { in.State = s; return nil })
}

// Register adds an instance at runtime. Its service must exist and its id be new.
func (r *Registry) Register(in Instance) error {
	if in.ID == "" || in.Address == "" || in.HTTPPort <= 0 && in.SIPPort <= 0 {
		return fmt.Errorf("instance needs an id, an address and a port: %w", ErrInvalid)
	}
	if a, err := netip.ParseAddr(in.Address); err == nil && a.IsUnspecified() {
		return fmt.Errorf("instance address %s is the unspecified address: %w", in.Address, ErrInvalid)
	}
	if in.State == "" {
		in.State = StateActive
	}
	if in.Health == "" {
		in.Health = HealthUnknown
	}
	if in.Weight == 0 {
		in.Weight = 1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	if _, ok := old.Service(in.Service); !ok {
		return fmt.Errorf("service %q: %w", in.Service, ErrUnknownService)
	}
	if _, ok := old.Instance(in.Key()); ok {
		return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, ErrExists)
	}
	next := withService(old.instances, in.Service)
	list := append(next[in.Service], in)
	slices.SortFunc(list, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
	next[in.Service] = list
	r.storeLocked(old.services, next)
	return nil
}

// Deregister removes an instance at runtime.
func (r *Registry) Deregister(k Key) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	if _, ok := old.Instance(k); !ok {
		return fmt.Errorf("instance %s/%s: %w", k.Service, k.ID, ErrUnknownInstance)
	}
	next := withService(old.instances, k.Service)
	next[k.Service] = slices.DeleteFunc(next[k.Service], func(in Instance) bool { return in.ID == k.ID })
	delete(r.configured, k)
	r.storeLocked(old.services, next)
	return nil
}

func (r *Registry) updateInstance(k Key, f func(*Instance) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	prev, ok := old.Instance(k)
	if !ok {
		return fmt.Errorf("instance %s/%s: %w", k.Service, k.ID, ErrUnknownInstance)
	}
	in := prev
	if err := f(&in); err != nil {
		return err
	}
	if in == prev {
		return nil // nothing changed: no new generation
	}
	next := withService(old.instances, k.Service)
	list := next[k.Service]
	for i := range list {
		if list[i].ID == k.ID {
			list[i] = in
		}
	}
	r.storeLocked(old.services, next)
	return nil
}

// withService returns a shallow copy of m in which only service's slice is a fresh copy, so a
// change to one service copies that service's instances and shares every other (immutable)
// slice with the published snapshot.
func withService(m map[string][]Instance, service string) map[string][]Instance {
	out := make(map[string][]Instance, len(m))
	for k, v := range m {
		out[k] = v
	}
	out[service] = slices.Clone(m[service])
	return out
}

// publishLocked stores a new generation if it differs from the current one (a config
// apply, where anything may or may not have changed). r.mu must be held.
func (r *Registry) publishLocked(services []Service, instances map[string][]Instance) {
	old := r.cur.Load()
	dropEmpty(instances)
	if reflect.DeepEqual(old.services, services) && reflect.DeepEqual(old.instances, instances) {
		return
	}
	r.storeLocked(services, instances)
}

// storeLocked publishes a new generation that is known to differ and wakes watchers.
// r.mu must be held.
func (r *Registry) storeLocked(services []Service, instances map[string][]Instance) {
	old := r.cur.Load()
	dropEmpty(instances)
	snap := &Snapshot{Generation: old.Generation + 1, services: services, instances: instances}
	r.cur.Store(snap)
	r.log.Debug("registry changed", "generation", snap.Generation)
	for ch := range r.watchers {
		select {
		case <-ch: // drop the stale generation the reader has not taken yet
		default:
		}
		ch <- snap
	}
}

// dropEmpty removes services without instances so equal content has one representation.
func dropEmpty(instances map[string][]Instance) {
	for name, list := range instances {
		if len(list) == 0 {
			delete(instances, name)
		}
	}
}
