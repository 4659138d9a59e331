package affinity

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// Session limits enforced by the SessionAPI (the seed's ranges).
const (
	MinSessionTTL = time.Second
	MaxSessionTTL = 6 * time.Hour
)

// CreateOptions are the parameters of CreateSession. Zero values take the service's defaults.
type CreateOptions struct {
	// ID is a client-chosen id, header services only (same syntax as the header field: 1–64
	// characters, first a letter, digit or '_', then letters, digits, '_' or '-'). "" generates
	// one. Cookie services always generate their ids.
	ID string
	// TTL is the session's total life, 1s..6h; 0 means the service's sessionTTL.
	TTL time.Duration
	// IdleTimeout is 0..TTL; 0 means the service's idleTimeout (capped at TTL).
	IdleTimeout time.Duration
	// DisableReuse nil means the service's disableSessionIdReuse.
	DisableReuse *bool
	// Attributes are user attributes stored with the session (copied).
	Attributes map[string]string
}

// UpdateOptions are the changes of UpdateSession; nil fields stay as they are.
type UpdateOptions struct {
	TTL, IdleTimeout *time.Duration
	DisableReuse     *bool
}

// InstanceUsage is one instance's slot usage.
type InstanceUsage struct {
	Instance   registry.Instance
	Sessions   int
	SessionCap int
	Requests   int
	RequestCap int
	// Streams and StreamCap count long-lived MCP streams (0 and 0 when the service counts
	// them as requests).
	Streams   int
	StreamCap int
}

// apiService returns the service of a SessionAPI call: it must exist and its mode must be
// managed by the SessionAPI (mode.api).
func (e *Engine) apiService(ctx context.Context, service string) (*svcState, error) {
	st, err := e.knownService(ctx, service)
	if err != nil {
		return nil, err
	}
	if st.mode.api == nil {
		return nil, fmt.Errorf("affinity: service %q uses %s affinity, %s: %w", service, st.mode.name, st.mode.apiRefusal, ErrUnsupported)
	}
	return st, nil
}

// knownService returns service's state in the current view, ErrUnknownService when the
// registry has no such service.
func (e *Engine) knownService(ctx context.Context, service string) (*svcState, error) {
	v, err := e.current(ctx)
	if err != nil {
		return nil, err
	}
	st := v.services[service]
	if st == nil {
		return nil, fmt.Errorf("affinity: service %q: %w", service, ErrUnknownService)
	}
	return st, nil
}

// viewService is apiService for reading and deleting sessions: it also accepts the modes whose
// sessions the SessionAPI sees but does not create (MCP sessions and handles).
func (e *Engine) viewService(ctx context.Context, service string) (*svcState, error) {
	v, err := e.current(ctx)
	if err != nil {
		return nil, err
	}
	if st := v.services[service]; st != nil && st.mode.apiView {
		return st, nil
	}
	return e.apiService(ctx, service)
}

func validTTL(d time.Duration) bool { return d >= MinSessionTTL && d <= MaxSessionTTL }

// CreateSession places a new session now (taking a session slot, not a request slot) and
// returns it. Placement follows the same rules as a request's new session; no capacity yields
// a *Reject of ClassNoCapacity. An id whose record is Active fails with session.ErrExists, as
// does the id of an ended session whose reuse is disabled.
func (e *Engine) CreateSession(ctx context.Context, service string, o CreateOptions) (session.Session, error) {
	st, err := e.apiService(ctx, service)
	if err != nil {
		return session.Session{}, err
	}
	if err := checkCreateID(st, o.ID); err != nil {
		return session.Session{}, err
	}
	ttl, idle, err := createTimes(st.svc, o)
	if err != nil {
		return session.Session{}, err
	}
	id, err := e.createID(ctx, service, o.ID)
	if err != nil {
		return session.Session{}, err
	}
	record := func(idx int) session.Session {
		s := e.newRecord(st, id, idx, st.mode.api.kind, e.now())
		s.TTL, s.IdleTimeout = ttl, idle
		if o.DisableReuse != nil {
			s.DisableReuse = *o.DisableReuse
		}
		s.Attributes = maps.Clone(o.Attributes)
		return s
	}
	if e.slotStore != nil {
		if len(st.insts) == 0 {
			return session.Session{}, e.noRoom(st)
		}
		if _, err := e.placeShared(ctx, st, record(0)); err != nil {
			var rej *Reject
			if errors.As(err, &rej) {
				return session.Session{}, rej
			}
			return session.Session{}, createError(id, err)
		}
		return e.store.Get(ctx, service, id)
	}
	idx, _, rej := e.placeSession(ctx, st, false)
	if rej != nil {
		return session.Session{}, rej
	}
	if err := e.store.Create(ctx, record(idx)); err != nil {
		st.slots[idx].ReleaseSession()
		// The store's guard is atomic with its insert (no check-then-act here).
		return session.Session{}, createError(id, err)
	}
	return e.store.Get(ctx, service, id)
}

// checkCreateID refuses a caller's session id (ErrInvalidArgument) where st's mode always
// generates ids, or where it is not a valid id. The empty id asks for a generated one.
func checkCreateID(st *svcState, id string) error {
	switch {
	case id == "":
		return nil
	case !st.mode.api.customIDs:
		return fmt.Errorf("affinity: service %q uses %s affinity, whose session ids are always generated: %w", st.svc.Name, st.mode.name, ErrInvalidArgument)
	case !session.ValidID(id):
		return fmt.Errorf("affinity: session id %q must be 1-64 characters: a letter, digit or '_', then letters, digits, '_' or '-': %w", id, ErrInvalidArgument)
	}
	return nil
}

// createTimes returns a new session's TTL and idle timeout: o's where set (TTL within
// MinSessionTTL..MaxSessionTTL, idle timeout within 0..TTL, ErrInvalidArgument otherwise), the
// service's otherwise, the idle timeout at most the TTL.
func createTimes(svc registry.Service, o CreateOptions) (ttl, idle time.Duration, err error) {
	ttl, idle = svc.SessionTTL, svc.IdleTimeout
	if o.TTL != 0 {
		if !validTTL(o.TTL) {
			return 0, 0, fmt.Errorf("affinity: TTL %v is outside %v..%v: %w", o.TTL, MinSessionTTL, MaxSessionTTL, ErrInvalidArgument)
		}
		ttl = o.TTL
	}
	if o.IdleTimeout != 0 {
		if o.IdleTimeout < 0 || o.IdleTimeout > ttl {
			return 0, 0, fmt.Errorf("affinity: idle timeout %v is outside 0..TTL (%v): %w", o.IdleTimeout, ttl, ErrInvalidArgument)
		}
		idle = o.IdleTimeout
	}
	return ttl, min(idle, ttl), nil
}

// createID returns id, or a generated id where it is empty. A given id whose record is Active
// is a conflict (session.ErrExists) whatever the capacity; the store's Create stays the atomic
// guard.
func (e *Engine) createID(ctx context.Context, service, id string) (string, error) {
	if id == "" {
		id, err := session.NewID()
		if err != nil {
			return "", fmt.Errorf("affinity: generating a session id: %w", err)
		}
		return id, nil
	}
	if old, err := e.store.Get(ctx, service, id); err == nil && old.Status == session.StatusActive {
		return "", fmt.Errorf("affinity: session %q exists: %w", id, session.ErrExists)
	}
	return id, nil
}

// createError words a failed create of session id: a disabled reuse is a conflict
// (session.ErrExists as well as session.ErrReuseDisabled).
func createError(id string, err error) error {
	if errors.Is(err, session.ErrReuseDisabled) {
		return fmt.Errorf("affinity: session %q has ended and its id may not be reused: %w: %w", id, session.ErrExists, err)
	}
	return fmt.Errorf("affinity: creating session: %w", err)
}

// GetSession returns a session record of a cookie, header or MCP service (MCP sessions and
// handles included) in any status while the store retains it (session.ErrNotFound otherwise).
func (e *Engine) GetSession(ctx context.Context, service, id string) (session.Session, error) {
	if _, err := e.viewService(ctx, service); err != nil {
		return session.Session{}, err
	}
	return e.store.Get(ctx, service, id)
}

// UpdateSession changes the TTL, idle timeout or reuse flag of an Active session without moving
// it (session.ErrExpired / ErrEnded otherwise). The resulting TTL must be 1s..6h and the idle
// timeout 0..TTL (ErrInvalidArgument).
func (e *Engine) UpdateSession(ctx context.Context, service, id string, o UpdateOptions) (session.Session, error) {
	if _, err := e.apiService(ctx, service); err != nil {
		return session.Session{}, err
	}
	if o.TTL != nil && !validTTL(*o.TTL) {
		return session.Session{}, fmt.Errorf("affinity: TTL %v is outside %v..%v: %w", *o.TTL, MinSessionTTL, MaxSessionTTL, ErrInvalidArgument)
	}
	return e.store.Update(ctx, service, id, func(s *session.Session) error {
		if o.TTL != nil {
			s.TTL = *o.TTL
		}
		if o.IdleTimeout != nil {
			s.IdleTimeout = *o.IdleTimeout
		}
		if s.IdleTimeout < 0 || s.IdleTimeout > s.TTL {
			return fmt.Errorf("affinity: idle timeout %v is outside 0..TTL (%v): %w", s.IdleTimeout, s.TTL, ErrInvalidArgument)
		}
		if o.DisableReuse != nil {
			s.DisableReuse = *o.DisableReuse
		}
		return nil
	})
}

// ListSessions pages through sessions (see session.Store.List). A named service must exist;
// naming a service without sessions (none, hash) or a sticky one is ErrUnsupported. Without a
// service, every session is listed.
func (e *Engine) ListSessions(ctx context.Context, f session.Filter, pageToken string, limit int) ([]session.Session, string, error) {
	if f.Service != "" {
		if _, err := e.viewService(ctx, f.Service); err != nil {
			return nil, "", err
		}
	}
	return e.store.List(ctx, f, pageToken, limit)
}

// DeleteSession stops routing by the session at once: it is Terminated, its session slot is
// freed, and the next request carrying its id starts a new session (even when id reuse is
// disabled: a deleted id counts as purged). Requests in flight finish on their instance and
// release their own request slots. MCP sessions and handles are deleted the same way: the
// client's next request with the id or handle is 404 (a new initialize, a new mint).
func (e *Engine) DeleteSession(ctx context.Context, service, id string) error {
	if _, err := e.viewService(ctx, service); err != nil {
		return err
	}
	// Deleting purges the id: clear the reuse guard first so the id can start a new session.
	if _, err := e.store.Update(ctx, service, id, func(s *session.Session) error {
		s.DisableReuse = false
		return nil
	}); err != nil && !errors.Is(err, session.ErrExpired) {
		return err
	}
	_, err := e.store.End(ctx, service, id, session.StatusTerminated, e.now())
	if errors.Is(err, session.ErrEnded) && errors.Is(err, session.ErrExpired) {
		return nil // it lapsed just now: ended all the same
	}
	return err
}

// Usage returns the slot usage of every instance of a service, ordered by instance id.
func (e *Engine) Usage(service string) ([]InstanceUsage, error) {
	v, err := e.current(context.Background())
	if err != nil {
		return nil, err
	}
	st := v.services[service]
	if st == nil {
		return nil, fmt.Errorf("affinity: service %q: %w", service, ErrUnknownService)
	}
	out := make([]InstanceUsage, len(st.insts))
	for i, in := range st.insts {
		sc, rc := st.slots[i].Caps()
		out[i] = InstanceUsage{Instance: in, Sessions: st.slots[i].Sessions(), SessionCap: sc,
			Requests: st.slots[i].Requests(), RequestCap: rc}
		if st.streams != nil {
			out[i].Streams = st.streams[i].Requests()
			_, out[i].StreamCap = st.streams[i].Caps()
		}
	}
	return out, nil
}

// drainPoll is how often WaitDrained looks at the counters.
const drainPoll = 50 * time.Millisecond

// WaitDrained blocks until the instance holds no session slot and no request slot, or ctx ends
// (its error is returned). An instance the engine never counted is drained at once.
func (e *Engine) WaitDrained(ctx context.Context, k registry.Key) error {
	if _, err := e.current(ctx); err != nil {
		return err
	}
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for {
		sl := e.slotsOf(k)
		if sl == nil || sl.Sessions() == 0 && sl.Requests() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("affinity: waiting for %s/%s to drain (%d sessions, %d requests left): %w",
				k.Service, k.ID, sl.Sessions(), sl.Requests(), ctx.Err())
		case <-t.C:
		}
	}
}

// DesiredInstances is the service's desired instance count: the instances holding sessions,
// plus one when every active instance is full (the scale-out gauge). 0 for an unknown service.
func (e *Engine) DesiredInstances(service string) int {
	v, err := e.current(context.Background())
	if err != nil {
		return 0
	}
	st := v.services[service]
	if st == nil {
		return 0
	}
	return st.desired()
}
