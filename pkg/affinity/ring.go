package affinity

import (
	"context"
	"fmt"

	"github.com/tether-dev/tether/pkg/registry"
)

// RingLookup returns the instance that hash key maps to now on service's consistent-hash
// (Maglev) ring for protocol p — among the healthy active instances with p's port, with the
// service's bounded load applied — as Kamailio's dispatcher.hash answers for a destination
// set. It is what a request whose hash key is key would reach (for a SIP request the key is
// the DCR rule's or "fromtag:callid"; for HTTP the DCR rule's or the peer "host:port"). It takes
// no slot and stores nothing. The service must use hash affinity or consistent-hash
// balancing (else a ClassBadRequest *Reject, code NoRing); ErrUnknownService for an unknown
// one; a ClassNoCapacity *Reject when no instance qualifies.
func (e *Engine) RingLookup(ctx context.Context, service string, p Protocol, key string) (registry.Instance, error) {
	st, err := e.knownService(ctx, service)
	if err != nil {
		return registry.Instance{}, err
	}
	if !st.mode.ring && st.svc.Balancing != registry.BalanceConsistentHash {
		return registry.Instance{}, &Reject{Class: ClassBadRequest, Code: "NoRing",
			Message: fmt.Sprintf("service %q has no consistent-hash ring (affinity %s, balancing %s)", service, st.svc.Affinity, st.svc.Balancing)}
	}
	pr := protoHTTP
	if p == ProtocolSIP {
		pr = protoSIP
	}
	idx, rej := e.hashPick(st, pr, key)
	if rej != nil {
		return registry.Instance{}, rej
	}
	return st.insts[idx], nil
}
