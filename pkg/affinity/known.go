package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// newSessionFunc creates a new session of a mode under id ("" generates one).
// peer is the client's address, for the per-client new-session limit.
type newSessionFunc func(ctx context.Context, e *Engine, st *svcState, id, peer string, now time.Time) (*decision, error)

// routeKnownID routes a request that carries a well-formed session id (cookie and header
// modes): Active → its instance (or a rebind); ended → ClassConflict under disabled reuse, else
// a new session under the same id; unknown → a new session under the client's id when
// keepUnknown, else under a new one.
func (e *Engine) routeKnownID(ctx context.Context, st *svcState, id, peer string, keepUnknown bool, create newSessionFunc, now time.Time) (*decision, error) {
	for range maxAttempts {
		s, err := e.store.Get(ctx, st.svc.Name, id)
		switch {
		case errors.Is(err, session.ErrNotFound):
			newID := ""
			if keepUnknown {
				newID = id
			}
			d, err := create(ctx, e, st, newID, peer, now)
			if errors.Is(err, session.ErrExists) {
				continue
			}
			return d, err
		case errors.Is(err, session.ErrStoreUnavailable):
			return nil, e.storeUnreadable(st, err)
		case err != nil:
			return nil, fmt.Errorf("affinity: reading session: %w", err)
		}
		if s.Status != session.StatusActive {
			if s.DisableReuse {
				return nil, &Reject{Class: ClassConflict, Code: "SessionIdReuseDisabled",
					Message: fmt.Sprintf("session %q has ended and service %q does not allow reusing session ids", id, st.svc.Name)}
			}
			// A new session under the same id. (A lapsed record still Active in the table is
			// replaced by Create, which announces its end, freeing its slot.)
			d, err := create(ctx, e, st, id, peer, now)
			if errors.Is(err, session.ErrExists) {
				continue
			}
			return d, err
		}
		d, err := e.routeExisting(ctx, st, s, now)
		if errors.Is(err, errRetry) {
			continue
		}
		return d, err
	}
	return nil, fmt.Errorf("affinity: session %q of service %q kept changing under concurrent requests", id, st.svc.Name)
}
