package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"
)

// ErrUnavailable reports that a change could not reach the store an AdminStore shares the
// admin layer through; nothing was changed. It wraps the store's error.
var ErrUnavailable = errors.New("shared registry unavailable")

// StateOverride is an administrative state set at runtime (SetState): Set applies while the
// instance's own layer still declares Declared (the state it declared when Set was chosen).
type StateOverride struct {
	Declared State
	Set      State
}

// AdminLayer is the admin API's layer as replicas share it: the instances registered through
// the admin API, the state overrides and the health verdicts, by instance key. States and
// Health may name instances of any layer (a config-file instance drained, a discovered
// instance found unhealthy).
type AdminLayer struct {
	Instances []Instance
	States    map[Key]StateOverride
	Health    map[Key]Health
}

// AdminStore keeps the admin layer where several replicas share it (pkg/fleet keeps it in
// Redis). With one set (ShareAdmin), the registry's admin writes (Register, Deregister,
// SetState, SetHealth) validate against this replica's snapshot and then go to the store
// instead of the local layer: the store's answer is the change. Each method must, when it
// returns nil, have delivered the resulting layer to ApplyAdmin, so that the replica that
// made a change sees it at once. Methods are called without any registry lock held and must
// be safe for concurrent use.
type AdminStore interface {
	// Register adds a registration; ErrExists if the key is registered already.
	Register(ctx context.Context, in Instance) error
	// Deregister removes a registration with its state override and health verdict;
	// ErrUnknownInstance if the key is not registered.
	Deregister(ctx context.Context, k Key) error
	// SetState records a state override; o.Set == o.Declared removes it.
	SetState(ctx context.Context, k Key, o StateOverride) error
	// SetHealth records a health verdict; HealthUnknown removes it.
	SetHealth(ctx context.Context, k Key, h Health) error
}

// adminTimeout bounds one write through the AdminStore (the admin API waits that long at most).
const adminTimeout = 5 * time.Second

// ShareAdmin makes s the home of the admin layer from now on (see AdminStore). Call it once,
// before the replica serves, and then deliver the store's current layer with ApplyAdmin. What
// the local admin layer held until then is dropped: the shared layer replaces it.
func (r *Registry) ShareAdmin(s AdminStore) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shared = s
	r.apiKind = "redis"
}

func (r *Registry) sharedStore() AdminStore {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.shared
}

// ApplyAdmin replaces the admin layer with l, the shared layer as the AdminStore last read
// it, marks the layer synced (and no longer failing), and publishes a new generation if the
// merged result changed. Registrations whose key another layer already defines are shadowed
// (see Precedence), those of unknown services orphaned; overrides and verdicts of keys that
// are not published are kept for when they are.
func (r *Registry) ApplyAdmin(l AdminLayer) {
	api := make(map[Key]Instance, len(l.Instances))
	for _, in := range l.Instances {
		if in.State == "" {
			in.State = StateActive
		}
		if in.Weight == 0 {
			in.Weight = 1
		}
		in.Health = HealthUnknown
		api[in.Key()] = in
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.api = api
	r.state = make(map[Key]stateOverride, len(l.States))
	for k, o := range l.States {
		r.state[k] = stateOverride{declared: o.Declared, set: o.Set}
	}
	r.checked = maps.Clone(l.Health)
	if r.checked == nil {
		r.checked = map[Key]Health{}
	}
	clear(r.localHealth)
	r.apiStat.markSynced(time.Now(), len(api))
	r.rebuildLocked()
}

// AdminFailed records that the shared admin layer could not be read or kept in sync: the last
// one delivered stays in use, and the layer's status says Failing with err until the next
// ApplyAdmin or AdminSynced.
func (r *Registry) AdminFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apiStat.failing = true
	r.apiStat.lastError = err.Error()
	r.apiStat.lastErrorAt = time.Now()
	r.apiStat.errors++
}

// AdminSynced records that the shared admin layer was confirmed current without a change. Local
// verdicts (SetHealthLocal) give way to the shared ones again.
func (r *Registry) AdminSynced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apiStat.markSynced(time.Now(), len(r.api))
	if len(r.localHealth) > 0 {
		clear(r.localHealth)
		r.rebuildLocked()
	}
}

// SetHealthLocal records a health verdict on this replica only: with a shared admin layer that
// cannot be reached (SetHealth failed with ErrUnavailable), the verdict stands in for the shared
// one until the layer is read again (ApplyAdmin or AdminSynced). Without a shared layer it is
// SetHealth. It reports whether the instance's health changed.
func (r *Registry) SetHealthLocal(k Key, h Health) (bool, error) {
	r.mu.Lock()
	if r.shared == nil {
		r.mu.Unlock()
		return r.SetHealth(k, h)
	}
	defer r.mu.Unlock()
	before, ok := r.cur.Load().Instance(k)
	if !ok {
		return false, fmt.Errorf("instance %s/%s: %w", k.Service, k.ID, ErrUnknownInstance)
	}
	r.localHealth[k] = h
	r.rebuildLocked()
	after, ok := r.cur.Load().Instance(k)
	return ok && after.Health != before.Health, nil
}

// sharedRegister is Register with a shared admin layer.
func (r *Registry) sharedRegister(s AdminStore, in Instance) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	return s.Register(ctx, in)
}

// sharedDeregister is Deregister with a shared admin layer: only registrations made through
// the admin API can be removed fleet-wide. A config-file instance is every replica's own
// config (remove it from their config files, or drain it); a discovered one follows its source.
func (r *Registry) sharedDeregister(s AdminStore, k Key, owner string) error {
	if owner != LayerAPI {
		what := fmt.Sprintf("discovery source %q, and follows it", owner)
		if owner == LayerConfig {
			what = "the config file; with a shared registry, remove it from every replica's config file or drain it"
		}
		return fmt.Errorf("instance %s/%s comes from %s: %w", k.Service, k.ID, what, ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	return s.Deregister(ctx, k)
}

// sharedSetState is SetState with a shared admin layer.
func (r *Registry) sharedSetState(s AdminStore, k Key, st State) error {
	r.mu.Lock()
	_, ok := r.cur.Load().Instance(k)
	declared, _ := r.declaredLocked(k)
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("instance %s/%s: %w", k.Service, k.ID, ErrUnknownInstance)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	return s.SetState(ctx, k, StateOverride{Declared: declared.State, Set: st})
}

// sharedSetHealth is SetHealth with a shared admin layer.
func (r *Registry) sharedSetHealth(s AdminStore, k Key, h Health) (bool, error) {
	before, ok := r.cur.Load().Instance(k)
	if !ok {
		return false, fmt.Errorf("instance %s/%s: %w", k.Service, k.ID, ErrUnknownInstance)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := s.SetHealth(ctx, k, h); err != nil {
		return false, err
	}
	after, ok := r.cur.Load().Instance(k)
	return ok && after.Health != before.Health, nil
}
