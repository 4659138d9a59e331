package affinity

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/dcr"
	"github.com/tether-dev/tether/pkg/registry"
)

// hashMode is consistent-hash affinity over the service's Maglev table (converged HTTP/SIP):
// SIP keys come from the DCR rules or the From tag and Call-ID; HTTP keys from the DCR rules
// or the peer address when the service has a DCR file, and without one HTTP uses sticky round
// robin. The same key reaches the same instance whichever protocol carries it (among the
// instances that have both ports). HTTP and SIP; no SessionAPI.
var hashMode = mode{
	affinity: registry.AffinityHash,
	name:     "hash",
	http:     true, sip: true,
	apiRefusal: "which has no sessions to manage",
	ring:       true,
	dcr:        true,
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		return decideHash(ctx, e, st, &req, now)
	},
}

func decideHash(ctx context.Context, e *Engine, st *svcState, req *Request, now time.Time) (*decision, error) {
	rules, hasDCR := e.rules(st)
	if req.Protocol == ProtocolSIP {
		key := req.HashKey
		if key == "" {
			var rej *Reject
			if key, rej = sipKey(rules, req); rej != nil {
				return nil, rej
			}
		}
		idx, rej := e.hashPick(st, protoSIP, key)
		if rej != nil {
			return nil, rej
		}
		d := e.newDecision(st, idx, nil, "", false, now)
		d.hashKey = key
		return d, nil
	}
	if !hasDCR {
		return decideSticky(ctx, e, st, req, now)
	}
	m := dcr.NewHTTPMessage(req.Method, req.Path, req.HeaderMap(), req.Peer)
	key, ok := rules.Key(m)
	if !ok {
		key = dcr.DefaultHTTPKey(m)
	}
	if key == "" {
		// Neither a rule nor the peer address gives a key: nothing to be consistent with.
		return e.freeDecision(ctx, st, req, now)
	}
	idx, rej := e.hashPick(st, protoHTTP, key)
	if rej != nil {
		return nil, rej
	}
	t, rej := e.admit(ctx, st, idx)
	if rej != nil {
		return nil, rej
	}
	return e.newDecision(st, idx, t, "", false, now), nil
}

// hashPick finds the key's instance among the healthy active instances with the protocol's
// port.
func (e *Engine) hashPick(st *svcState, p proto, key string) (int, *Reject) {
	if st.maglev != nil {
		if idx, ok := st.lookup(balance.Hash(key), st.placeFn[p]); ok {
			return idx, nil
		}
	}
	return -1, e.reject(ClassNoCapacity, "NoCapacity", fmt.Sprintf("service %q has no healthy active instance with a %s port", st.svc.Name, p))
}

// sipKey extracts a SIP request's hash key: the first DCR rule that yields one, else the From
// tag and Call-ID. The message is req.SIP when the caller parsed it, else req.SIPMessage
// parsed here; without either it is built from Method (INVITE when empty), Path (the
// Request-URI) and Headers by dcr.NewSIPMessage.
func sipKey(rules *dcr.Rules, req *Request) (string, *Reject) {
	m := req.SIP
	var err error
	switch {
	case m != nil:
	case len(req.SIPMessage) > 0:
		m, err = dcr.ParseSIP(req.SIPMessage)
	default:
		method := req.Method
		if method == "" {
			method = "INVITE"
		}
		m, err = dcr.NewSIPMessage(method, req.Path, req.Headers)
	}
	if err != nil {
		return "", &Reject{Class: ClassBadRequest, Code: "InvalidSIPMessage", Message: fmt.Sprintf("cannot parse the SIP request: %v", err)}
	}
	if key, ok := rules.Key(m); ok {
		return key, nil
	}
	if key := dcr.DefaultSIPKey(m); key != "" {
		return key, nil
	}
	return "", &Reject{Class: ClassBadRequest, Code: "MissingHashKey", Message: "the SIP request has neither a From tag nor a Call-ID"}
}
