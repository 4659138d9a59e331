package affinity

import (
	"context"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
)

// noneMode: no affinity. Each request is balanced by the service's balancing among the
// instances that can serve its protocol; nothing is learned. SIP is served too (each initial
// request balanced among the instances with a SIP port; in-dialog requests never come back).
var noneMode = mode{
	affinity: registry.AffinityNone,
	name:     "none",
	http:     true, sip: true,
	apiRefusal: "which has no sessions to manage",
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		return e.freeDecision(ctx, st, &req, now)
	},
}

// freeDecision balances a request that belongs to no session.
func (e *Engine) freeDecision(ctx context.Context, st *svcState, req *Request, now time.Time) (*decision, error) {
	algo := st.svc.Balancing
	if algo == registry.BalanceStickyRoundRobin {
		algo = registry.BalanceRoundRobin
	}
	idx, t, rej := e.pickFree(ctx, st, protoOf(req), algo, req.Peer)
	if rej != nil {
		return nil, rej
	}
	return e.newDecision(st, idx, t, "", false, now), nil
}
