package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// strategy names a service's per-mode decision function (one per affinity mode). Dispatch is
// a switch rather than a function value so the Request stays on the caller's stack.
type strategy uint8

const (
	modeNone strategy = iota
	modeSticky
	modeCookie
	modeHeader
	modeMCPStreamable
	modeMCPSSE
	modeHash
)

func strategyFor(svc registry.Service) strategy {
	switch svc.Affinity {
	case registry.AffinityCookie:
		return modeCookie
	case registry.AffinityHeader:
		return modeHeader
	case registry.AffinityMCPStreamable:
		return modeMCPStreamable
	case registry.AffinityMCPSSE:
		return modeMCPSSE
	case registry.AffinityHash:
		return modeHash
	default:
		if svc.Balancing == registry.BalanceStickyRoundRobin {
			return modeSticky
		}
		return modeNone
	}
}

func (e *Engine) decide(ctx context.Context, st *svcState, req *Request, now time.Time) (*decision, error) {
	switch st.mode {
	case modeSticky:
		return decideSticky(ctx, e, st, req, now)
	case modeCookie:
		return decideCookie(ctx, e, st, req, now)
	case modeHeader:
		return decideHeader(ctx, e, st, req, now)
	case modeMCPStreamable:
		return decideMCPStreamable(ctx, e, st, req, now)
	case modeMCPSSE:
		return decideMCPSSE(ctx, e, st, req, now)
	case modeHash:
		return decideHash(ctx, e, st, req, now)
	default:
		return decideNone(ctx, e, st, req, now)
	}
}

// Decide routes one request or refuses it with a *Reject. An admitted HTTP request holds a
// request slot until the Decision's End. Any other error is an internal failure.
func (e *Engine) Decide(ctx context.Context, req Request) (Decision, error) {
	v, err := e.current(ctx)
	if err != nil {
		return nil, err
	}
	st, rej := v.resolve(&req)
	if rej != nil {
		return nil, rej
	}
	d, err := e.decide(ctx, st, &req, e.now())
	if err != nil {
		return nil, err
	}
	if d.ticket != nil {
		e.open.add(d) // from here on the sweeper and MCP DELETEs may End it
	}
	return d, nil
}

// decideNone balances a request with no affinity by the service's algorithm.
func decideNone(_ context.Context, e *Engine, st *svcState, req *Request, now time.Time) (*decision, error) {
	return e.freeDecision(st, req, now)
}

// freeDecision balances a request that belongs to no session.
func (e *Engine) freeDecision(st *svcState, req *Request, now time.Time) (*decision, error) {
	algo := st.svc.Balancing
	if algo == registry.BalanceStickyRoundRobin {
		algo = registry.BalanceRoundRobin
	}
	idx, t, rej := e.pickFree(st, algo, req.Peer)
	if rej != nil {
		return nil, rej
	}
	return e.newDecision(st, idx, t, "", false, now), nil
}

// decideSticky is sticky round robin: new requests round robin; the sticky cookie the response
// gets pins the client's later requests to that instance while it is routable.
func decideSticky(ctx context.Context, e *Engine, st *svcState, req *Request, now time.Time) (*decision, error) {
	if id, ok := cookieValue(req.Headers["cookie"], st.svc.Cookie.Name); ok && session.IsGeneratedID(id) {
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
	idx, t, rej := e.pickFree(st, registry.BalanceRoundRobin, "")
	if rej != nil {
		return nil, rej
	}
	d := e.newDecision(st, idx, t, "", false, now)
	d.resp = respStickyNew
	return d, nil
}

// decideCookie is generated-cookie affinity.
func decideCookie(ctx context.Context, e *Engine, st *svcState, req *Request, now time.Time) (*decision, error) {
	id, ok := cookieValue(req.Headers["cookie"], st.svc.Cookie.Name)
	if !ok {
		return e.newCookieSession(ctx, st, "", now)
	}
	if !session.IsGeneratedID(id) {
		return nil, &Reject{Class: ClassBadRequest, Code: "InvalidSessionId",
			Message: fmt.Sprintf("cookie %s must hold a session id issued by tether (32 lower-case hex digits)", st.svc.Cookie.Name)}
	}
	return e.routeKnownID(ctx, st, id, session.KindCookie, now)
}

func (e *Engine) newCookieSession(ctx context.Context, st *svcState, id string, now time.Time) (*decision, error) {
	d, err := e.createSession(ctx, st, id, session.KindCookie, now)
	if err != nil {
		return nil, err
	}
	d.resp = respSetCookie
	return d, nil
}

// decideHeader is header-field affinity.
func decideHeader(ctx context.Context, e *Engine, st *svcState, req *Request, now time.Time) (*decision, error) {
	id := req.Header(st.svc.HeaderField)
	if id == "" {
		d, err := e.createSession(ctx, st, "", session.KindHeader, now)
		if err != nil {
			return nil, err
		}
		d.resp = respEchoHeader
		return d, nil
	}
	if !session.ValidID(id) {
		return nil, &Reject{Class: ClassBadRequest, Code: "InvalidSessionId",
			Message: fmt.Sprintf("header %s must be 1-64 characters: a letter, digit or '_', then letters, digits, '_' or '-'", st.svc.HeaderField)}
	}
	return e.routeKnownID(ctx, st, id, session.KindHeader, now)
}

// routeKnownID routes a cookie or header request that carries a well-formed session id.
func (e *Engine) routeKnownID(ctx context.Context, st *svcState, id string, kind session.Kind, now time.Time) (*decision, error) {
	for range maxAttempts {
		s, err := e.store.Get(ctx, st.svc.Name, id)
		switch {
		case errors.Is(err, session.ErrNotFound):
			var d *decision
			if kind == session.KindCookie {
				// Never issued (or purged): a new session under a new id; a client never
				// picks its id in cookie mode.
				d, err = e.newCookieSession(ctx, st, "", now)
			} else {
				d, err = e.createSession(ctx, st, id, kind, now)
			}
			if errors.Is(err, session.ErrReuseDisabled) {
				return nil, reuseDisabled(st, id)
			}
			if errors.Is(err, session.ErrExists) {
				continue
			}
			return d, err
		case err != nil:
			return nil, fmt.Errorf("affinity: reading session: %w", err)
		}
		if s.Status != session.StatusActive {
			if s.DisableReuse {
				return nil, reuseDisabled(st, id)
			}
			// A new session under the same id. (A lapsed record still Active in the table is
			// replaced by Create, which announces its end, freeing its slot.)
			var d *decision
			if kind == session.KindCookie {
				d, err = e.newCookieSession(ctx, st, id, now)
			} else {
				d, err = e.createSession(ctx, st, id, kind, now)
			}
			if errors.Is(err, session.ErrReuseDisabled) {
				// The record ended (and was marked not reusable) after the Get above: the
				// store's atomic guard in Create refused the id.
				return nil, reuseDisabled(st, id)
			}
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

func reuseDisabled(st *svcState, id string) *Reject {
	return &Reject{Class: ClassConflict, Code: "SessionIdReuseDisabled",
		Message: fmt.Sprintf("session %q has ended and service %q does not allow reusing session ids", id, st.svc.Name)}
}
