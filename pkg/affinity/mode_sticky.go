package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// stickyMode is sticky round robin (balancing sticky-round-robin on a none service): new
// requests go round robin; the sticky cookie their response gets pins the client's later
// requests to that instance while it is routable. HTTP only (a cookie).
var stickyMode = mode{
	affinity:   registry.AffinityNone,
	balancing:  registry.BalanceStickyRoundRobin,
	name:       "sticky-round-robin",
	http:       true,
	apiRefusal: "whose sticky sessions are created by responses only",
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		return decideSticky(ctx, e, st, &req, now)
	},
}

// decideSticky is sticky round robin; hash services without a DCR file use it for HTTP too.
func decideSticky(ctx context.Context, e *Engine, st *svcState, req *Request, now time.Time) (*decision, error) {
	if id, ok := requestCookie(req, st.svc.Cookie.Name); ok && session.IsGeneratedID(id) {
		for range maxAttempts {
			s, err := e.store.Get(ctx, st.svc.Name, id)
			if err != nil && !errors.Is(err, session.ErrNotFound) {
				return nil, fmt.Errorf("affinity: reading sticky session: %w", err)
			}
			if err != nil || s.Status != session.StatusActive || s.Kind != session.KindSticky {
				break // unknown or ended: a new request
			}
			d, err := e.routeExisting(ctx, st, s, now)
			if errors.Is(err, errRetry) {
				continue
			}
			return d, err
		}
	}
	idx, t, rej := e.pickFree(ctx, st, protoHTTP, registry.BalanceRoundRobin, "")
	if rej != nil {
		return nil, rej
	}
	d := e.newDecision(st, idx, t, "", false, now)
	d.h = stickyNew{}
	return d, nil
}

// stickyNew: a new sticky request's response may create its sticky session.
type stickyNew struct{ plainExchange }

// respond creates the sticky session when the upstream set the configured cookie (or always,
// when none is configured) and issues its cookie.
func (stickyNew) respond(d *decision, resp Response) []HeaderValue {
	svc := &d.st.svc
	if svc.Sticky.UpstreamCookie != "" && !responseSetsCookie(&resp, svc.Sticky.UpstreamCookie) {
		return nil
	}
	idx := d.idx
	if i, ok := d.servedIndex(resp); ok {
		idx = i
	}
	id, err := session.NewID()
	if err != nil {
		d.e.log.Error("affinity: generating a sticky session id", "service", svc.Name, "err", err)
		return nil
	}
	now := d.e.now()
	if err := d.e.store.Create(context.Background(), d.e.newRecord(d.st, id, idx, session.KindSticky, now)); err != nil {
		d.e.log.Error("affinity: creating a sticky session", "service", svc.Name, "err", err)
		return nil
	}
	return []HeaderValue{{Name: "set-cookie", Value: setCookie(svc.Cookie, id, svc.SessionTTL), Append: true}}
}

// cookieIssue: the response carries the session's cookie (a new cookie session, or a sticky
// session that moved).
type cookieIssue struct{ plainExchange }

func (cookieIssue) respond(d *decision, _ Response) []HeaderValue {
	svc := &d.st.svc
	return []HeaderValue{{Name: "set-cookie", Value: setCookie(svc.Cookie, d.sessionID, svc.SessionTTL), Append: true}}
}
