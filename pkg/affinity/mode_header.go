package affinity

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// headerMode is header-field affinity: the id travels in service.HeaderField; a new session's
// generated id is returned in the same header; a client's unknown id names a new session
// (placement stays the engine's). HTTP only; SessionAPI-managed, with client-chosen ids.
var headerMode = mode{
	affinity: registry.AffinityHeader,
	name:     "header",
	http:     true,
	api:      &apiSupport{kind: session.KindHeader, customIDs: true},
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		id := req.Header(st.svc.HeaderField)
		if id == "" {
			return newHeaderSession(ctx, e, st, "", req.Peer, now)
		}
		if !session.ValidID(id) {
			return nil, &Reject{Class: ClassBadRequest, Code: "InvalidSessionId",
				Message: fmt.Sprintf("header %s must be 1-64 characters: a letter, digit or '_', then letters, digits, '_' or '-'", st.svc.HeaderField)}
		}
		return e.routeKnownID(ctx, st, id, req.Peer, true, newHeaderSession, now)
	},
}

// newHeaderSession creates a header session; a generated id is echoed in the header field.
func newHeaderSession(ctx context.Context, e *Engine, st *svcState, id, peer string, now time.Time) (*decision, error) {
	d, err := e.createClaimedSession(ctx, st, id, peer, session.KindHeader, now)
	if err != nil {
		return nil, err
	}
	if id == "" {
		d.h = headerEcho{}
	}
	return d, nil
}

// headerEcho: the response carries the generated id in the header field (overwrite).
type headerEcho struct{ plainExchange }

func (headerEcho) respond(d *decision, _ Response) []HeaderValue {
	return []HeaderValue{{Name: d.st.svc.HeaderField, Value: d.sessionID}}
}
