package status

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/registry"
)

// Engine is what the assembler reads from the affinity engine.
type Engine interface {
	Usage(service string) ([]affinity.InstanceUsage, error)
	DesiredInstances(service string) int
}

// Assembler builds snapshots. Build it with New.
type Assembler struct {
	reg      *registry.Registry
	engine   Engine
	extProc  func() *tetherv1.ExtProcStatus
	xds      func() *tetherv1.XdsStatus
	events   *Events
	outcomes *Outcomes
	calls    func(service string) []calls.Load
	store    func() *tetherv1.StoreStatus
	now      func() time.Time
}

// Option configures an Assembler.
type Option func(*Assembler)

// WithExtProc adds the ext_proc server's counters (see ExtProcStatus).
func WithExtProc(f func() *tetherv1.ExtProcStatus) Option {
	return func(a *Assembler) { a.extProc = f }
}

// WithXDS adds the xDS server's state (see XDSStatus).
func WithXDS(f func() *tetherv1.XdsStatus) Option { return func(a *Assembler) { a.xds = f } }

// WithEvents adds the recent scale events.
func WithEvents(e *Events) Option { return func(a *Assembler) { a.events = e } }

// WithOutcomes adds each service's decision counts by outcome (fed by Metrics.TimedDecider).
func WithOutcomes(o *Outcomes) Option { return func(a *Assembler) { a.outcomes = o } }

// WithCalls adds each instance's SIP call load (calls.Tracker.Loads).
func WithCalls(loads func(service string) []calls.Load) Option {
	return func(a *Assembler) { a.calls = loads }
}

// WithStore adds the shared store's state (see StoreStatus; redis backend only).
func WithStore(f func() *tetherv1.StoreStatus) Option { return func(a *Assembler) { a.store = f } }

// WithClock sets the clock that stamps snapshots (default time.Now).
func WithClock(now func() time.Time) Option { return func(a *Assembler) { a.now = now } }

// New returns an assembler over reg and engine (engine may be nil: no slot usage).
func New(reg *registry.Registry, engine Engine, opts ...Option) *Assembler {
	a := &Assembler{reg: reg, engine: engine, now: time.Now}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Snapshot assembles a fresh snapshot. The result is the caller's.
func (a *Assembler) Snapshot() *tetherv1.Status {
	snap := a.reg.Snapshot()
	out := &tetherv1.Status{Time: timestamppb.New(a.now()), Generation: snap.Generation}
	for _, svc := range snap.Services() {
		out.Services = append(out.Services, a.service(snap, svc))
	}
	if a.extProc != nil {
		out.ExtProc = a.extProc()
	}
	if a.xds != nil {
		out.Xds = a.xds()
	}
	if a.events != nil {
		out.Events = a.events.Recent()
	}
	out.Sources = SourcesProto(a.reg.Sources())
	if a.store != nil {
		out.Store = a.store()
	}
	return out
}

// SourcesProto is the API form of the registry's layers (see registry.SourceStatus).
func SourcesProto(list []registry.SourceStatus) []*tetherv1.DiscoverySource {
	out := make([]*tetherv1.DiscoverySource, 0, len(list))
	for _, s := range list {
		p := &tetherv1.DiscoverySource{
			Name: s.Name, Kind: s.Kind, Synced: s.Synced, Failing: s.Failing,
			Services: int32(s.Services), Instances: int32(s.Instances), Shadowed: int32(s.Shadowed), Orphaned: int32(s.Orphaned),
			Refused: int32(s.Refused), LastError: s.LastError, Errors: s.Errors,
		}
		if !s.LastSync.IsZero() {
			p.LastSync = timestamppb.New(s.LastSync)
		}
		if !s.LastErrorAt.IsZero() {
			p.LastErrorTime = timestamppb.New(s.LastErrorAt)
		}
		out = append(out, p)
	}
	return out
}

func (a *Assembler) service(snap *registry.Snapshot, svc registry.Service) *tetherv1.ServiceStatus {
	s := &tetherv1.ServiceStatus{Name: svc.Name, Affinity: string(svc.Affinity)}
	if a.outcomes != nil {
		s.Decisions = a.outcomes.Service(svc.Name)
	}
	var usage []affinity.InstanceUsage
	if a.engine != nil {
		usage, _ = a.engine.Usage(svc.Name) // a service the engine has not seen yet: no usage
		s.DesiredInstances = int32(a.engine.DesiredInstances(svc.Name))
	}
	if usage != nil {
		for _, u := range usage {
			s.Instances = append(s.Instances, UsageProto(u))
		}
	} else {
		for _, in := range snap.Instances(svc.Name) {
			s.Instances = append(s.Instances, InstanceProto(in))
		}
	}
	slices.SortFunc(s.Instances, func(x, y *tetherv1.Instance) int { return strings.Compare(x.GetId(), y.GetId()) })
	if a.calls != nil {
		AddCalls(s.Instances, a.calls(svc.Name))
	}
	// Actual counts the instances in use, as desired does: a standby instance holding sessions
	// is the instance scale-out opened (it serves them), so it counts.
	for _, in := range s.Instances {
		if in.GetHealth() == tetherv1.InstanceHealth_INSTANCE_HEALTH_UNHEALTHY {
			continue
		}
		if st := in.GetState(); st == tetherv1.InstanceState_INSTANCE_STATE_ACTIVE || st == tetherv1.InstanceState_INSTANCE_STATE_STANDBY && in.GetSessions() > 0 {
			s.ActualInstances++
		}
	}
	return s
}

var stateToProto = map[registry.State]tetherv1.InstanceState{
	registry.StateActive:   tetherv1.InstanceState_INSTANCE_STATE_ACTIVE,
	registry.StateStandby:  tetherv1.InstanceState_INSTANCE_STATE_STANDBY,
	registry.StateDraining: tetherv1.InstanceState_INSTANCE_STATE_DRAINING,
}

var healthToProto = map[registry.Health]tetherv1.InstanceHealth{
	registry.HealthUnknown:   tetherv1.InstanceHealth_INSTANCE_HEALTH_UNKNOWN,
	registry.HealthHealthy:   tetherv1.InstanceHealth_INSTANCE_HEALTH_HEALTHY,
	registry.HealthUnhealthy: tetherv1.InstanceHealth_INSTANCE_HEALTH_UNHEALTHY,
}

// StateProto returns the API enum of a registry state (UNSPECIFIED for an unknown one).
func StateProto(s registry.State) tetherv1.InstanceState { return stateToProto[s] }

// HealthFromProto returns the registry health of an API enum.
func HealthFromProto(h tetherv1.InstanceHealth) (registry.Health, bool) {
	for k, v := range healthToProto {
		if v == h {
			return k, true
		}
	}
	return "", false
}

// StateFromProto returns the registry state of an API enum.
func StateFromProto(s tetherv1.InstanceState) (registry.State, bool) {
	for k, v := range stateToProto {
		if v == s {
			return k, true
		}
	}
	return "", false
}

// InstanceProto is the API form of an instance, without slot usage.
func InstanceProto(in registry.Instance) *tetherv1.Instance {
	return &tetherv1.Instance{
		Service:  in.Service,
		Id:       in.ID,
		Address:  in.Address,
		HttpPort: int32(in.HTTPPort),
		SipPort:  int32(in.SIPPort),
		Weight:   in.Weight,
		Zone:     in.Zone,
		State:    stateToProto[in.State],
		Health:   healthToProto[in.Health],
	}
}

// UsageProto is the API form of an instance with its slot usage.
func UsageProto(u affinity.InstanceUsage) *tetherv1.Instance {
	p := InstanceProto(u.Instance)
	p.Sessions = int32(u.Sessions)
	p.SessionCapacity = int32(u.SessionCap)
	p.Requests = int32(u.Requests)
	p.RequestCapacity = int32(u.RequestCap)
	p.Streams = int32(u.Streams)
	p.StreamCapacity = int32(u.StreamCap)
	return p
}

// Word is the short lower-case word of an API enum value: INSTANCE_STATE_ACTIVE → "active",
// INSTANCE_HEALTH_UNHEALTHY → "unhealthy", SCALE_EVENT_KIND_SCALE_OUT → "scale-out".
func Word(name, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, prefix)), "_", "-")
}

// Outcomes counts decisions by service and outcome. Safe for concurrent use.
type Outcomes struct {
	mu sync.Mutex
	n  map[string]map[string]*atomic.Uint64 // guarded by mu; the counts themselves are atomic
	// cells finds a count without the lock: outcomeKey → *atomic.Uint64.
	cells sync.Map
}

type outcomeKey struct{ service, outcome string }

// NewOutcomes returns empty counts.
func NewOutcomes() *Outcomes { return &Outcomes{n: map[string]map[string]*atomic.Uint64{}} }

// Add counts one decision. Safe for concurrent use; after a (service, outcome) pair's first
// count it takes no lock.
func (o *Outcomes) Add(service, outcome string) { o.counter(service, outcome).Add(1) }

// counter returns the count of (service, outcome), creating it at zero.
func (o *Outcomes) counter(service, outcome string) *atomic.Uint64 {
	k := outcomeKey{service, outcome}
	if c, ok := o.cells.Load(k); ok {
		return c.(*atomic.Uint64)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.n[service]
	if m == nil {
		m = map[string]*atomic.Uint64{}
		o.n[service] = m
	}
	c := m[outcome]
	if c == nil {
		c = new(atomic.Uint64)
		m[outcome] = c
		o.cells.Store(k, c)
	}
	return c
}

// All returns a copy of every service's counts: service → outcome → count.
func (o *Outcomes) All() map[string]map[string]uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]map[string]uint64, len(o.n))
	for svc, m := range o.n {
		c := make(map[string]uint64, len(m))
		for k, v := range m {
			c[k] = v.Load()
		}
		out[svc] = c
	}
	return out
}

// Service returns a copy of one service's counts (nil when it has none).
func (o *Outcomes) Service(service string) map[string]uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.n[service]
	if m == nil {
		return nil
	}
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v.Load()
	}
	return out
}

// AddCalls sets each instance's SIP call load (calls, answered, cap) from loads. instances
// must be sorted by id. The one place the snapshot and the instances API take call counts
// from, so they agree.
func AddCalls(instances []*tetherv1.Instance, loads []calls.Load) {
	for _, l := range loads {
		i, ok := slices.BinarySearchFunc(instances, l.Instance, func(x *tetherv1.Instance, id string) int { return strings.Compare(x.GetId(), id) })
		if ok {
			instances[i].Calls, instances[i].CallsAnswered, instances[i].CallCapacity = int32(l.Total()), int32(l.Answered), int32(l.Cap)
		}
	}
}
