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
	"slices"
	"sync"
	"sync/atomic"
	"time"
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
//
// The published snapshot merges layers (see sources.go): the config file (Apply), the admin API
// (Register), and discovery sources (UpdateSource), with runtime state and health verdicts kept
// beside them. Each layer is replaced on its own, so a config reload leaves the admin API's
// instances and every discovered instance alone.
type Registry struct {
	log *slog.Logger

	mu       sync.Mutex // serializes writers and guards everything below cur
	cur      atomic.Pointer[Snapshot]
	watchers map[chan *Snapshot]struct{}

	config  layer                   // the config file's services and instances
	api     map[Key]Instance        // instances registered through the admin API
	apiStat sourceStat              // the admin API layer's status
	apiKind string                  // the admin API layer's kind: "api", or "redis" when shared
	shared  AdminStore              // where the admin layer lives when replicas share it; nil: here
	sources map[string]*sourceLayer // discovery sources by name
	state   map[Key]stateOverride   // runtime state (SetState), until the layer changes it
	checked map[Key]Health          // active health-check verdicts (SetHealth)
	// localHealth are verdicts kept on this replica while the shared admin layer is unreachable
	// (SetHealthLocal); they stand in for checked until the layer is read again.
	localHealth map[Key]Health
	shadowed    map[string]int // per layer name: instances hidden by a layer before it
	orphaned    map[string]int // per layer name: instances whose service does not exist
	refused     map[string]int // per layer name: instances whose address the policy refuses
	refusedKeys map[Key]bool   // the keys counted in refused, logged once each
	policy      *AddressPolicy // nil: every address
}

// Option configures a Registry.
type Option func(*Registry)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(r *Registry) { r.log = l } }

// WithAddressPolicy sets the policy every layer's instances must pass (see AddressPolicy and
// SetAddressPolicy); the default, nil, allows every address.
func WithAddressPolicy(p *AddressPolicy) Option { return func(r *Registry) { r.policy = p } }

// New returns an empty registry at generation 0.
func New(opts ...Option) *Registry {
	r := &Registry{
		log:         slog.New(slog.DiscardHandler),
		watchers:    map[chan *Snapshot]struct{}{},
		api:         map[Key]Instance{},
		sources:     map[string]*sourceLayer{},
		state:       map[Key]stateOverride{},
		checked:     map[Key]Health{},
		apiKind:     "api",
		localHealth: map[Key]Health{},
	}
	for _, o := range opts {
		o(r)
	}
	r.apiStat.markSynced(time.Now(), 0) // the admin API's set is always complete
	r.cur.Store(&Snapshot{instances: map[string][]Instance{}})
	return r
}

// AddressPolicy returns the policy in force (nil: every address is allowed).
func (r *Registry) AddressPolicy() *AddressPolicy {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.policy
}

// SetAddressPolicy replaces the address policy (a config reload) and publishes a new
// generation without the instances the new policy refuses, and with those it now allows. It
// never fails: refused instances are counted in their layer's status (Refused) and logged.
func (r *Registry) SetAddressPolicy(p *AddressPolicy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.policy = p
	r.rebuildLocked()
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

// Apply replaces the config file's services and instances (a config load or reload). Instances
// registered through the admin API and discovered instances are not touched. Instances that
// survive keep their health; their runtime state is kept too unless the config changed it.
// Instances whose service is missing are rejected. Apply publishes a new generation only if
// something changed.
func (r *Registry) Apply(services []Service, instances []Instance) error {
	svcs := slices.Clone(services)
	slices.SortFunc(svcs, func(a, b Service) int { return cmp.Compare(a.Name, b.Name) })
	for i := 1; i < len(svcs); i++ {
		if svcs[i].Name == svcs[i-1].Name {
			return fmt.Errorf("service %q: %w", svcs[i].Name, ErrExists)
		}
	}
	byKey := make(map[Key]Instance, len(instances))
	policy := r.AddressPolicy()
	for _, in := range instances {
		if _, ok := slices.BinarySearchFunc(svcs, in.Service, func(a Service, n string) int { return cmp.Compare(a.Name, n) }); !ok {
			return fmt.Errorf("instance %q: service %q: %w", in.ID, in.Service, ErrUnknownService)
		}
		if err := policy.CheckInstance(in); err != nil {
			return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, err)
		}
		if _, dup := byKey[in.Key()]; dup {
			return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, ErrExists)
		}
		byKey[in.Key()] = in
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.config = layer{services: svcs, instances: byKey}
	r.config.stat.markSynced(time.Now(), len(byKey))
	r.rebuildLocked()
	return nil
}

// SetHealth records an active health check's verdict (HealthUnknown forgets it). The
// instance's health is the verdict combined with what its source declares (see
// combineHealth). It reports whether the instance's health changed.
//
// With a shared admin layer (ShareAdmin) the verdict is recorded there, for every replica.
func (r *Registry) SetHealth(k Key, h Health) (bool, error) {
	if s := r.sharedStore(); s != nil {
		return r.sharedSetHealth(s, k, h)
	}
	changed := false
	err := r.updateInstance(k, func(in *Instance) error {
		declared, _ := r.declaredLocked(k)
		if h == HealthUnknown {
			delete(r.checked, k)
		} else {
			r.checked[k] = h
		}
		next := combineHealth(declared.Health, h)
		changed = in.Health != next
		in.Health = next
		return nil
	})
	return changed, err
}

// SetState sets an instance's administrative state. With a shared admin layer (ShareAdmin)
// the override is recorded there, for every replica.
func (r *Registry) SetState(k Key, s State) error {
	switch s {
	case StateActive, StateStandby, StateDraining:
	default:
		return fmt.Errorf("state %q: %w", s, ErrInvalid)
	}
	if st := r.sharedStore(); st != nil {
		return r.sharedSetState(st, k, s)
	}
	return r.updateInstance(k, func(in *Instance) error {
		declared, _ := r.declaredLocked(k)
		if s == declared.State {
			delete(r.state, k)
		} else {
			r.state[k] = stateOverride{declared: declared.State, set: s}
		}
		in.State = s
		return nil
	})
}

// Register adds an instance at runtime (the admin API's layer). Its service must exist and its
// id be new. It survives config reloads until Deregister removes it. With a shared admin
// layer (ShareAdmin) the registration is made there, for every replica.
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
	if in.Weight == 0 {
		in.Weight = 1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.policy.CheckInstance(in); err != nil {
		return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, err)
	}
	old := r.cur.Load()
	if _, ok := old.Service(in.Service); !ok {
		return fmt.Errorf("service %q: %w", in.Service, ErrUnknownService)
	}
	if _, ok := old.Instance(in.Key()); ok {
		return fmt.Errorf("instance %s/%s: %w", in.Service, in.ID, ErrExists)
	}
	if s := r.shared; s != nil {
		return r.unlocked(func() error { return r.sharedRegister(s, in) })
	}
	r.api[in.Key()] = in
	r.apiStat.markSynced(time.Now(), len(r.api))
	r.rebuildLocked()
	return nil
}

// Deregister removes an instance at runtime. An instance registered through the admin API is
// gone for good; one from the config file is gone until a reload lists it again. A discovered
// instance follows its source and cannot be deregistered (drain it, or change the source).
// With a shared admin layer (ShareAdmin) only admin-API registrations can be deregistered, and
// for every replica.
func (r *Registry) Deregister(k Key) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	if _, ok := old.Instance(k); !ok {
		return fmt.Errorf("instance %s/%s: %w", k.Service, k.ID, ErrUnknownInstance)
	}
	owner := r.ownerLocked(k)
	if s := r.shared; s != nil {
		return r.unlocked(func() error { return r.sharedDeregister(s, k, owner) })
	}
	switch owner {
	case LayerConfig:
		delete(r.config.instances, k)
	case LayerAPI:
		delete(r.api, k)
		r.apiStat.markSynced(time.Now(), len(r.api))
	default:
		return fmt.Errorf("instance %s/%s comes from discovery source %q and follows it: %w", k.Service, k.ID, owner, ErrInvalid)
	}
	delete(r.state, k)
	delete(r.checked, k)
	r.rebuildLocked()
	return nil
}

// unlocked runs f with r.mu released (a write to the shared admin layer waits for the store,
// which delivers its answer through ApplyAdmin) and takes r.mu again for the caller's deferred
// Unlock. r.mu must be held.
func (r *Registry) unlocked(f func() error) error {
	r.mu.Unlock()
	defer r.mu.Lock()
	return f()
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
