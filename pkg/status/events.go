package status

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

// MaxRecentEvents is how many events the snapshot carries.
const MaxRecentEvents = 100

// Event is one autoscaling signal.
type Event struct {
	Time time.Time
	// Kind is KindScaleOut or KindScaleIn.
	Kind     string
	Service  string
	Instance string
	// Desired is the service's desired instances when it happened.
	Desired int
}

// Event kinds, as the webhook, the metrics and the CLI spell them.
const (
	KindScaleOut = "scale-out"
	KindScaleIn  = "scale-in"
)

// Proto is the API form of the event.
func (e Event) Proto() *tetherv1.ScaleEvent {
	k := tetherv1.ScaleEventKind_SCALE_EVENT_KIND_SCALE_OUT
	if e.Kind == KindScaleIn {
		k = tetherv1.ScaleEventKind_SCALE_EVENT_KIND_SCALE_IN
	}
	return &tetherv1.ScaleEvent{Time: timestamppb.New(e.Time), Kind: k, Service: e.Service, Instance: e.Instance,
		DesiredInstances: int32(e.Desired)}
}

// Events keeps the recent scale events, counts them, and hands each to its subscribers.
type Events struct {
	now func() time.Time
	log *slog.Logger

	mu     sync.Mutex
	ring   []Event // oldest first, at most MaxRecentEvents
	counts map[[2]string]uint64
	subs   []func(Event)
	// emptySince: per instance that held sessions, when it became empty (zero while it holds
	// sessions); signalled marks those whose scale-in was reported.
	emptySince map[registry.Key]time.Time
	signalled  map[registry.Key]bool
}

// NewEvents returns an empty event log. now may be nil (time.Now), log may be nil.
func NewEvents(now func() time.Time, log *slog.Logger) *Events {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Events{now: now, log: log, counts: map[[2]string]uint64{},
		emptySince: map[registry.Key]time.Time{}, signalled: map[registry.Key]bool{}}
}

// Subscribe calls f with every later event, synchronously on the emitting goroutine (from the
// engine's scale-out hook, so f must be fast and must not call the engine: queue and return).
func (e *Events) Subscribe(f func(Event)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.subs = append(e.subs, f)
}

// ScaleOut records the engine's scale-out signal; pass it to affinity.WithScaleOutHook.
func (e *Events) ScaleOut(so affinity.ScaleOut) {
	e.mu.Lock()
	e.emptySince[so.Instance.Key()] = time.Time{} // in use now: a later emptiness is scale-in news
	delete(e.signalled, so.Instance.Key())
	e.mu.Unlock()
	e.emit(Event{Time: e.now(), Kind: KindScaleOut, Service: so.Service, Instance: so.Instance.ID, Desired: so.Desired})
}

func (e *Events) emit(ev Event) {
	e.mu.Lock()
	if len(e.ring) == MaxRecentEvents {
		copy(e.ring, e.ring[1:])
		e.ring = e.ring[:MaxRecentEvents-1]
	}
	e.ring = append(e.ring, ev)
	e.counts[[2]string{ev.Service, ev.Kind}]++
	subs := e.subs
	e.mu.Unlock()
	for _, f := range subs {
		f(ev)
	}
}

// Recent returns the recent events, oldest first.
func (e *Events) Recent() []*tetherv1.ScaleEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*tetherv1.ScaleEvent, len(e.ring))
	for i, ev := range e.ring {
		out[i] = ev.Proto()
	}
	return out
}

// Counts returns the number of events by service and kind since start.
func (e *Events) Counts() map[[2]string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[[2]string]uint64, len(e.counts))
	for k, v := range e.counts {
		out[k] = v
	}
	return out
}

// ScanScaleIn looks at every instance's sessions once: an instance that held sessions and has
// been empty for at least after (by the Events clock) is reported as scale-in, once, until it
// holds sessions again. Instances never used are not reported (an idle standby is not news).
func (e *Events) ScanScaleIn(reg *registry.Registry, engine Engine, after time.Duration) {
	now := e.now()
	snap := reg.Snapshot()
	seen := map[registry.Key]bool{}
	var fire []Event
	e.mu.Lock()
	for _, svc := range snap.Services() {
		usage, err := engine.Usage(svc.Name)
		if err != nil {
			continue
		}
		for _, u := range usage {
			k := u.Instance.Key()
			seen[k] = true
			if u.Sessions > 0 {
				e.emptySince[k] = time.Time{}
				delete(e.signalled, k)
				continue
			}
			since, used := e.emptySince[k]
			if !used {
				continue
			}
			if since.IsZero() {
				e.emptySince[k] = now
				since = now
			}
			if !e.signalled[k] && now.Sub(since) >= after {
				e.signalled[k] = true
				fire = append(fire, Event{Time: now, Kind: KindScaleIn, Service: svc.Name, Instance: u.Instance.ID,
					Desired: engine.DesiredInstances(svc.Name)})
			}
		}
	}
	for k := range e.emptySince {
		if !seen[k] {
			delete(e.emptySince, k)
			delete(e.signalled, k)
		}
	}
	e.mu.Unlock()
	for _, ev := range fire {
		e.log.Info("status: scale-in: instance empty", "service", ev.Service, "instance", ev.Instance, "after", after)
		e.emit(ev)
	}
}

// WatchScaleIn runs ScanScaleIn every interval until ctx ends.
func (e *Events) WatchScaleIn(ctx context.Context, reg *registry.Registry, engine Engine, after, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		e.ScanScaleIn(reg, engine, after)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
