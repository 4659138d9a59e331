package affinity

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// ProvisionalAttribute marks a session created by a request whose client has not come back
// with it yet: its idle timeout is the engine's provisional one (WithProvisionalIdleTimeout)
// until the client's next request with the id, which promotes it (the attribute goes, the
// service's idle timeout applies). Attributes under "tether." are tether's own.
const ProvisionalAttribute = "tether.provisional"

// NewSessionLimit rate-limits the sessions one client address may open through requests (the
// data plane; SessionAPI creates are not limited): a token bucket per address (IPv4 /32, IPv6
// /64) refilled at PerSecond up to Burst. Addresses in Trusted are not limited. PerSecond ≤ 0
// turns the limit off.
type NewSessionLimit struct {
	PerSecond float64
	Burst     int
	Trusted   []netip.Prefix
}

// WithNewSessionLimit limits new sessions per client address (default: off). A request over
// the limit is refused with ClassTooManyRequests (code NewSessionRateLimited) and a RetryAfter
// until the next token. Requests without a known peer address are not limited.
func WithNewSessionLimit(l NewSessionLimit) Option {
	return func(e *Engine) {
		if l.PerSecond > 0 {
			e.limiter = newClientLimiter(l)
		}
	}
}

// WithProvisionalIdleTimeout gives sessions created by a request the idle timeout d (capped
// at the service's) until their client returns with the id (default 0: off). A client that
// never returns (no cookie jar) frees the slot after d.
func WithProvisionalIdleTimeout(d time.Duration) Option {
	return func(e *Engine) { e.provisionalIdle = d }
}

// maxLimitedClients bounds the buckets kept; addresses beyond it share one bucket.
const maxLimitedClients = 100_000

type clientLimiter struct {
	rate    float64
	burst   float64
	trusted []netip.Prefix

	mu       sync.Mutex
	buckets  map[netip.Prefix]*bucket
	overflow bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newClientLimiter(l NewSessionLimit) *clientLimiter {
	return &clientLimiter{rate: l.PerSecond, burst: float64(max(l.Burst, 1)), trusted: l.Trusted, buckets: map[netip.Prefix]*bucket{}}
}

// clientKey is the limited address of a peer "ip:port" (IPv6 by /64); ok false when the peer
// is unknown or trusted.
func (l *clientLimiter) clientKey(peer string) (netip.Prefix, bool) {
	ap, err := netip.ParseAddrPort(peer)
	var a netip.Addr
	if err == nil {
		a = ap.Addr()
	} else if a, err = netip.ParseAddr(peer); err != nil {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	for _, p := range l.trusted {
		if p.Contains(a) {
			return netip.Prefix{}, false
		}
	}
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p, true
}

// allow takes a token for peer; when none is left it returns the wait until the next one.
func (l *clientLimiter) allow(peer string, now time.Time) (bool, time.Duration) {
	k, ok := l.clientKey(peer)
	if !ok {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[k]
	if b == nil {
		if len(l.buckets) >= maxLimitedClients {
			b = &l.overflow
		} else {
			b = &bucket{tokens: l.burst, last: now}
			l.buckets[k] = b
		}
	}
	b.refill(l, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

func (b *bucket) refill(l *clientLimiter, now time.Time) {
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(l.burst, b.tokens+el.Seconds()*l.rate)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
}

// prune forgets the buckets that are full again (their clients are back to a full burst).
func (l *clientLimiter) prune(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, b := range l.buckets {
		if b.refill(l, now); b.tokens >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// admitNewSession applies the per-client limit to a request about to open a session.
func (e *Engine) admitNewSession(st *svcState, peer string, now time.Time) *Reject {
	if e.limiter == nil {
		return nil
	}
	ok, wait := e.limiter.allow(peer, now)
	if ok {
		return nil
	}
	return &Reject{Class: ClassTooManyRequests, Code: "NewSessionRateLimited", RetryAfter: max(wait, time.Second),
		Message: fmt.Sprintf("this client opened new sessions of service %q too fast (%g per second, burst %g); send the session id back (keep cookies) or retry later",
			st.svc.Name, e.limiter.rate, e.limiter.burst)}
}

// markProvisional makes a session created by a request provisional (see ProvisionalAttribute).
func (e *Engine) markProvisional(st *svcState, s *session.Session) {
	if e.provisionalIdle <= 0 {
		return
	}
	idle := e.provisionalIdle
	if st.svc.IdleTimeout > 0 {
		idle = min(idle, st.svc.IdleTimeout)
	}
	s.IdleTimeout = min(idle, s.TTL)
	s.Attributes = map[string]string{ProvisionalAttribute: "true"}
}

// promote makes a provisional session a full one: its client came back with the id.
func (e *Engine) promote(ctx context.Context, st *svcState, s session.Session) {
	if _, ok := s.Attributes[ProvisionalAttribute]; !ok {
		return
	}
	_, err := e.store.Update(ctx, st.svc.Name, s.ID, func(cur *session.Session) error {
		if _, ok := cur.Attributes[ProvisionalAttribute]; !ok {
			return nil
		}
		attrs := make(map[string]string, len(cur.Attributes))
		for k, v := range cur.Attributes {
			if k != ProvisionalAttribute {
				attrs[k] = v
			}
		}
		cur.Attributes = attrs
		cur.IdleTimeout = min(st.svc.IdleTimeout, cur.TTL)
		return nil
	})
	if err != nil {
		e.log.Warn("affinity: promoting a provisional session", "service", st.svc.Name, "session", s.ID, "err", err)
	}
}
