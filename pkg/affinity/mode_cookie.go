package affinity

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// cookieMode is generated-cookie affinity: tether issues the id in the cookie
// service.Cookie.Name; a client never chooses its id. HTTP only; SessionAPI-managed.
var cookieMode = mode{
	affinity: registry.AffinityCookie,
	name:     "cookie",
	http:     true,
	api:      &apiSupport{kind: session.KindCookie},
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		id, ok := requestCookie(&req, st.svc.Cookie.Name)
		if !ok {
			return newCookieSession(ctx, e, st, "", req.Peer, now)
		}
		if !session.IsGeneratedID(id) {
			return nil, &Reject{Class: ClassBadRequest, Code: "InvalidSessionId",
				Message: fmt.Sprintf("cookie %s must hold a session id issued by tether (32 lower-case hex digits)", st.svc.Cookie.Name)}
		}
		// Never issued (or purged): a new session under a NEW id.
		return e.routeKnownID(ctx, st, id, req.Peer, false, newCookieSession, now)
	},
}

// newCookieSession creates a cookie session (id "" generates one) whose response issues the
// cookie.
func newCookieSession(ctx context.Context, e *Engine, st *svcState, id, peer string, now time.Time) (*decision, error) {
	d, err := e.createClaimedSession(ctx, st, id, peer, session.KindCookie, now)
	if err != nil {
		return nil, err
	}
	d.h = cookieIssue{}
	return d, nil
}
