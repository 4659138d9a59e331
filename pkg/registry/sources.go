package registry

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"time"
)

// Layer names of the two built-in layers. Discovery sources use any other name.
const (
	LayerConfig = "config"
	LayerAPI    = "api"
)

// Precedence. The published snapshot merges, in this order:
//
//  1. the config file (Apply),
//  2. instances registered through the admin API (Register),
//  3. discovery sources (UpdateSource), ordered by source name.
//
// A service name or instance key (service, id) defined by an earlier layer hides the same name or
// key in every later layer; hidden entries are counted as Shadowed in that layer's status and
// come back if the earlier layer drops them. An instance whose service exists in no layer is
// counted as Orphaned and not published. Each layer is replaced on its own: a config reload does
// not touch instances registered through the admin API or discovered ones.
//
// On top of the layers, two kinds of runtime facts are kept per instance key for as long as the
// key is published (with a shared admin layer, for as long as the shared layer holds them):
//
//   - state set through SetState (drain, standby, activate) overrides the state its layer
//     declares, until that layer itself declares a different state (a config edit, or a
//     Kubernetes endpoint that starts terminating), which then wins (with a shared admin layer
//     the override stays in the shared layer but no longer applies);
//   - the active health check's verdict (SetHealth) combines with the health the layer declares
//     (a source's readiness) as combineHealth says.

// combineHealth is an instance's health from what its layer declares and the active check's
// verdict: unhealthy if either says so, else healthy if either says so, else unknown.
func combineHealth(declared, checked Health) Health {
	switch {
	case declared == HealthUnhealthy || checked == HealthUnhealthy:
		return HealthUnhealthy
	case declared == HealthHealthy || checked == HealthHealthy:
		return HealthHealthy
	default:
		return HealthUnknown
	}
}

// SourceStatus is one layer's state for the status API and metrics.
type SourceStatus struct {
	// Name is LayerConfig, LayerAPI or the discovery source's name.
	Name string
	// Kind is "file", "api" ("redis" when replicas share the admin layer, see ShareAdmin), or
	// the source's kind ("kubernetes", "xds", "dns", "gateway-api").
	Kind string
	// Synced is true once the layer delivered a complete set.
	Synced bool
	// Failing is true when the last attempt to refresh the set failed; the last good set stays
	// in use (LastError says why).
	Failing bool
	// Services and Instances count what the layer declares.
	Services, Instances int
	// Shadowed counts the layer's instances hidden by an earlier layer (see Precedence);
	// Orphaned those whose service exists nowhere; Refused those whose address or port the
	// AddressPolicy refuses (not published; the registry logs each once per change).
	Shadowed, Orphaned, Refused int
	// LastSync is when the layer last delivered a set; LastError and LastErrorAt describe the
	// last failure, Errors counts failures since start.
	LastSync    time.Time
	LastError   string
	LastErrorAt time.Time
	Errors      uint64
}

type sourceStat struct {
	synced      bool
	failing     bool
	count       int
	lastSync    time.Time
	lastError   string
	lastErrorAt time.Time
	errors      uint64
}

func (s *sourceStat) markSynced(now time.Time, count int) {
	s.synced, s.failing, s.count, s.lastSync = true, false, count, now
}

// layer is one set of services and instances, as its owner declared them.
type layer struct {
	services  []Service // sorted by name
	instances map[Key]Instance
	stat      sourceStat
}

type sourceLayer struct {
	layer
	kind string
}

type stateOverride struct {
	declared State // the layer's state when the override was set
	set      State
}

// UpdateSource replaces the complete set of a discovery source (created on first use): its
// services (may be empty) and instances. Instances need an id, an address and a port; State
// defaults to active, Weight to 1, Health to unknown. It marks the source synced and not failing,
// and publishes a new generation if the merged result changed.
func (r *Registry) UpdateSource(name, kind string, services []Service, instances []Instance) error {
	if name == "" || name == LayerConfig || name == LayerAPI {
		return fmt.Errorf("source name %q: %w", name, ErrInvalid)
	}
	svcs := slices.Clone(services)
	slices.SortFunc(svcs, func(a, b Service) int { return cmp.Compare(a.Name, b.Name) })
	for i := 1; i < len(svcs); i++ {
		if svcs[i].Name == svcs[i-1].Name {
			return fmt.Errorf("source %q: service %q: %w", name, svcs[i].Name, ErrExists)
		}
	}
	byKey, err := sourceInstances(name, instances)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	src := r.sourceLocked(name, kind)
	src.services, src.instances = svcs, byKey
	src.stat.markSynced(time.Now(), len(byKey))
	r.rebuildLocked()
	return nil
}

// sourceInstances checks the instances of source name and returns them by key with their
// defaults set.
func sourceInstances(name string, instances []Instance) (map[Key]Instance, error) {
	byKey := make(map[Key]Instance, len(instances))
	for _, in := range instances {
		if in.Service == "" || in.ID == "" || in.Address == "" || in.HTTPPort <= 0 && in.SIPPort <= 0 {
			return nil, fmt.Errorf("source %q: instance %s/%s needs a service, an id, an address and a port: %w", name, in.Service, in.ID, ErrInvalid)
		}
		if a, err := netip.ParseAddr(in.Address); err == nil && a.IsUnspecified() {
			return nil, fmt.Errorf("source %q: instance %s/%s: address %s is the unspecified address: %w", name, in.Service, in.ID, in.Address, ErrInvalid)
		}
		if _, dup := byKey[in.Key()]; dup {
			return nil, fmt.Errorf("source %q: instance %s/%s: %w", name, in.Service, in.ID, ErrExists)
		}
		if in.State == "" {
			in.State = StateActive
		}
		if in.Weight == 0 {
			in.Weight = 1
		}
		if in.Health == "" {
			in.Health = HealthUnknown
		}
		byKey[in.Key()] = in
	}
	return byKey, nil
}

// SourceFailed records that a discovery source could not refresh its set. Its last good set
// stays published; its status says Failing with err until the next UpdateSource.
func (r *Registry) SourceFailed(name, kind string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	src := r.sourceLocked(name, kind)
	src.stat.failing = true
	src.stat.lastError = err.Error()
	src.stat.lastErrorAt = time.Now()
	src.stat.errors++
}

// RemoveSource drops a discovery source and everything it declared (a source removed from the
// config). Removing an unknown source does nothing.
func (r *Registry) RemoveSource(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.sources[name]; !ok {
		return
	}
	delete(r.sources, name)
	r.rebuildLocked()
}

// Sources returns every layer's status in precedence order: config, api, then the discovery
// sources by name.
func (r *Registry) Sources() []SourceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []SourceStatus{
		r.statusLocked(LayerConfig, "file", &r.config),
		r.statusLocked(LayerAPI, r.apiKind, &layer{instances: r.api, stat: r.apiStat}),
	}
	for _, name := range r.sourceNamesLocked() {
		src := r.sources[name]
		out = append(out, r.statusLocked(name, src.kind, &src.layer))
	}
	return out
}

func (r *Registry) statusLocked(name, kind string, l *layer) SourceStatus {
	return SourceStatus{
		Name:        name,
		Kind:        kind,
		Synced:      l.stat.synced,
		Failing:     l.stat.failing,
		Services:    len(l.services),
		Instances:   len(l.instances),
		Shadowed:    r.shadowed[name],
		Orphaned:    r.orphaned[name],
		Refused:     r.refused[name],
		LastSync:    l.stat.lastSync,
		LastError:   l.stat.lastError,
		LastErrorAt: l.stat.lastErrorAt,
		Errors:      l.stat.errors,
	}
}

func (r *Registry) sourceLocked(name, kind string) *sourceLayer {
	src, ok := r.sources[name]
	if !ok {
		src = &sourceLayer{kind: kind}
		r.sources[name] = src
	}
	return src
}

func (r *Registry) sourceNamesLocked() []string {
	names := make([]string, 0, len(r.sources))
	for n := range r.sources {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// layersLocked returns the layers' names and instances in precedence order.
func (r *Registry) layersLocked() ([]string, []map[Key]Instance) {
	names := []string{LayerConfig, LayerAPI}
	sets := []map[Key]Instance{r.config.instances, r.api}
	for _, n := range r.sourceNamesLocked() {
		names = append(names, n)
		sets = append(sets, r.sources[n].instances)
	}
	return names, sets
}

// declaredLocked returns the instance as the layer that wins for k declares it.
func (r *Registry) declaredLocked(k Key) (Instance, string) {
	snap := r.cur.Load()
	names, sets := r.layersLocked()
	for i, set := range sets {
		if in, ok := set[k]; ok {
			if _, svc := snap.Service(k.Service); svc {
				return in, names[i]
			}
		}
	}
	return Instance{}, ""
}

// ownerLocked returns the name of the layer that publishes k.
func (r *Registry) ownerLocked(k Key) string {
	_, name := r.declaredLocked(k)
	return name
}

// rebuildLocked merges the layers into a new generation and publishes it if anything changed.
// Runtime state and health verdicts of keys no longer published are forgotten. r.mu must be held.
func (r *Registry) rebuildLocked() {
	services, have := r.mergedServicesLocked()
	m := merge{
		have: have, shadowed: map[string]int{}, orphaned: map[string]int{}, refused: map[string]int{},
		seen: map[Key]bool{}, refusedKeys: map[Key]bool{}, instances: map[string][]Instance{},
	}
	names, sets := r.layersLocked()
	for i, set := range sets {
		for _, k := range sortedKeys(set) {
			if in, ok := r.publishableLocked(&m, names[i], k, set[k]); ok {
				m.instances[k.Service] = append(m.instances[k.Service], in)
			}
		}
	}
	if r.shared == nil { // a shared layer's facts are the store's to keep or drop
		maps.DeleteFunc(r.state, func(k Key, _ stateOverride) bool { return !m.seen[k] })
		maps.DeleteFunc(r.checked, func(k Key, _ Health) bool { return !m.seen[k] })
	}
	for _, list := range m.instances {
		slices.SortFunc(list, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
	}
	r.shadowed, r.orphaned, r.refused, r.refusedKeys = m.shadowed, m.orphaned, m.refused, m.refusedKeys
	old := r.cur.Load()
	if reflect.DeepEqual(old.services, services) && reflect.DeepEqual(old.instances, m.instances) {
		return
	}
	r.storeLocked(services, m.instances)
}

// merge is what rebuildLocked gathers: the services' names (have), the count per layer of
// instances shadowed by a layer before, orphaned (no such service) and refused by the address
// policy, the keys published and refused, and the instances to publish by service.
type merge struct {
	have                        map[string]bool
	shadowed, orphaned, refused map[string]int
	seen, refusedKeys           map[Key]bool
	instances                   map[string][]Instance
}

// mergedServicesLocked returns the config's services and those of the discovery sources that
// the config does not declare (the first source by name wins), by name, and their names.
func (r *Registry) mergedServicesLocked() ([]Service, map[string]bool) {
	services := slices.Clone(r.config.services)
	have := map[string]bool{}
	for _, s := range services {
		have[s.Name] = true
	}
	for _, n := range r.sourceNamesLocked() {
		for _, s := range r.sources[n].services {
			if !have[s.Name] {
				have[s.Name] = true
				services = append(services, s)
			}
		}
	}
	slices.SortFunc(services, func(a, b Service) int { return cmp.Compare(a.Name, b.Name) })
	if len(services) == 0 {
		services = nil // one representation of "none", so equal content compares equal
	}
	return services, have
}

// publishableLocked decides whether layer's instance in (key k) is published, counting it in
// m if not, and returns it with its state override and health verdict applied.
func (r *Registry) publishableLocked(m *merge, layer string, k Key, in Instance) (Instance, bool) {
	switch {
	case !m.have[k.Service]:
		m.orphaned[layer]++
		return in, false
	case m.seen[k]:
		m.shadowed[layer]++
		return in, false
	}
	if err := r.policy.CheckInstance(in); err != nil {
		m.refused[layer]++
		if !r.refusedKeys[k] { // once, until it is published or gone
			r.log.Warn("instance not published: its address is refused", "layer", layer, "service", k.Service, "instance", k.ID, "error", err)
		}
		m.refusedKeys[k] = true
		return in, false
	}
	m.seen[k] = true
	if in.State == "" {
		in.State = StateActive
	}
	if ov, ok := r.state[k]; ok {
		switch {
		case ov.declared == in.State:
			in.State = ov.set
		case r.shared == nil:
			delete(r.state, k) // the layer changed the state itself: it wins
		}
	}
	verdict, local := r.localHealth[k]
	if !local {
		verdict = r.checked[k]
	}
	in.Health = combineHealth(in.Health, verdict)
	return in, true
}

func sortedKeys(m map[Key]Instance) []Key {
	keys := make([]Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.ID, b.ID))
	})
	return keys
}
