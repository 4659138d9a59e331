package affinity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// ProvisionalAttribute marks a session created by a request whose client has not come back
// with it yet: its idle timeout is the engine's provisional one (WithProvisionalIdleTimeout)
// until the client's next request with the id, which promotes it (the attribute goes, the
// service's idle timeout applies). Attributes under "tether." are tether's own.
const ProvisionalAttribute = "tether.provisional"

// NewSessionLimit bounds the sessions one client opens through requests (the data plane;
// SessionAPI creates are not limited), per client bucket:
//
//   - buckets: an IPv4 address (/32), an IPv6 /64; beyond them, every IPv6 /48 — and with
//     GroupIPv4By24 every IPv4 /24 — is a wide bucket WideFactor times as large, charged too,
//     so rotating /64s inside one /48 (65,536 of them) buys WideFactor clients, not 65,536;
//     every request without a usable source address shares one bucket of one client's size;
//   - rate: a token bucket refilled at PerSecond up to Burst (wide: × WideFactor); over it,
//     ClassTooManyRequests code NewSessionRateLimited with RetryAfter until the next token;
//   - ceiling: at most MaxSessions sessions of one service held at a time (wide:
//     × WideFactor), and never more than ServiceShare of the service's session slots
//     (SessionsPerInstance × instances, at least 1) in any one bucket; over it,
//     ClassTooManyRequests code ClientSessionLimit, RetryAfter 1s. A returning client's
//     sessions count as long as they live: coming back keeps a session, not the right to more.
//
// Addresses in Trusted are not limited. PerSecond ≤ 0 turns the rate off, MaxSessions ≤ 0 and
// ServiceShare ≤ 0 the ceilings. Counts are this replica's: replicas sharing a store each
// apply the limits to the requests they decide.
type NewSessionLimit struct {
	PerSecond float64
	Burst     int
	Trusted   []netip.Prefix
	// MaxSessions is the concurrent-session ceiling of one client bucket per service.
	MaxSessions int
	// ServiceShare is the largest fraction of a service's session slots one bucket may hold.
	ServiceShare float64
	// WideFactor sizes the wide buckets (IPv6 /48, IPv4 /24 with GroupIPv4By24) in clients;
	// ≤ 0 means 4.
	WideFactor    int
	GroupIPv4By24 bool
}

// WithNewSessionLimit limits new sessions per client bucket (default: off); see
// NewSessionLimit.
func WithNewSessionLimit(l NewSessionLimit) Option {
	return func(e *Engine) {
		if l.PerSecond > 0 || l.MaxSessions > 0 || l.ServiceShare > 0 {
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

// maxLimitedClients bounds the rate buckets kept; addresses beyond it share one bucket.
const maxLimitedClients = 100_000

// heldRecheck is how often a bucket at its ceiling asks the store which of its sessions still
// live (sessions end by idling out or being deleted without the limiter hearing of it).
const heldRecheck = time.Second

type clientLimiter struct {
	rate, burst float64
	maxSessions int
	share       float64
	wide        int
	group24     bool
	trusted     []netip.Prefix

	mu       sync.Mutex
	buckets  map[netip.Prefix]*bucket
	overflow bucket
	held     map[heldKey]*heldSet
	noAddr   netip.Prefix // the key of requests without a usable source address
}

type bucket struct {
	tokens float64
	last   time.Time
}

// heldKey is one client bucket's sessions of one service.
type heldKey struct {
	service string
	client  netip.Prefix
}

// heldSet is what one bucket holds of a service: live session ids, and claims not bound to
// a session yet (an MCP initialize waiting for its response).
type heldSet struct {
	ids     map[string]struct{}
	pending int
	checked time.Time
}

func (h *heldSet) count() int { return len(h.ids) + h.pending }

// clientBucket is one bucket a request is charged to; wide buckets count WideFactor clients.
type clientBucket struct {
	key  netip.Prefix
	wide bool
}

func newClientLimiter(l NewSessionLimit) *clientLimiter {
	wide := l.WideFactor
	if wide <= 0 {
		wide = 4
	}
	return &clientLimiter{rate: l.PerSecond, burst: float64(max(l.Burst, 1)), maxSessions: l.MaxSessions, share: l.ServiceShare,
		wide: wide, group24: l.GroupIPv4By24, trusted: l.Trusted, buckets: map[netip.Prefix]*bucket{}, held: map[heldKey]*heldSet{},
		// 0.0.0.0/0 never keys a real client (their keys are /32, /24, /64 or /48).
		noAddr: netip.PrefixFrom(netip.IPv4Unspecified(), 0)}
}

// peerAddr is the address of a peer "ip:port" (or "ip"), unmapped and without zone; ok false
// when there is no usable one.
func peerAddr(peer string) (netip.Addr, bool) {
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(peer); err == nil {
		a = ap.Addr()
	} else if a, err = netip.ParseAddr(peer); err != nil {
		return netip.Addr{}, false
	}
	a = a.Unmap().WithZone("")
	return a, !a.IsUnspecified()
}

// NoClientAddress is the ClientBucket of every peer without a usable address.
const NoClientAddress = "no-address"

// ClientBucket names the narrow client bucket of a peer "ip:port" (or "ip") as the limits key
// clients: the IPv4 address as a /32, the IPv6 /64, or NoClientAddress — one bucket shared by
// all — when the peer has no usable address. pkg/sipdecide keys SIP sources by it.
func ClientBucket(peer string) string {
	a, ok := peerAddr(peer)
	if !ok {
		return NoClientAddress
	}
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

// clientBuckets returns the buckets of a peer "ip:port" (or "ip"), narrow first; nil when
// the peer is trusted. A peer without a usable address gets the shared no-address bucket.
func (l *clientLimiter) clientBuckets(peer string) []clientBucket {
	a, ok := peerAddr(peer)
	if !ok {
		return []clientBucket{{key: l.noAddr}}
	}
	for _, p := range l.trusted {
		if p.Contains(a) {
			return nil
		}
	}
	if a.Is4() {
		p, _ := a.Prefix(32)
		out := []clientBucket{{key: p}}
		if l.group24 {
			w, _ := a.Prefix(24)
			out = append(out, clientBucket{key: w, wide: true})
		}
		return out
	}
	p, _ := a.Prefix(64)
	w, _ := a.Prefix(48)
	return []clientBucket{{key: p}, {key: w, wide: true}}
}

func (l *clientLimiter) factor(b clientBucket) float64 {
	if b.wide {
		return float64(l.wide)
	}
	return 1
}

// takeTokens takes a token from each bucket, or none when one is empty (then it returns
// the wait until that one has a token). l.mu must be held.
func (l *clientLimiter) takeTokensLocked(cbs []clientBucket, now time.Time) (bool, time.Duration) {
	if l.rate <= 0 {
		return true, 0
	}
	bs := make([]*bucket, len(cbs))
	for i, cb := range cbs {
		b := l.buckets[cb.key]
		if b == nil {
			if len(l.buckets) >= maxLimitedClients {
				b = &l.overflow
			} else {
				b = &bucket{tokens: l.burst * l.factor(cb), last: now}
				l.buckets[cb.key] = b
			}
		}
		f := l.factor(cb)
		b.refill(l.rate*f, l.burst*f, now)
		if b.tokens < 1 {
			return false, time.Duration((1 - b.tokens) / (l.rate * f) * float64(time.Second))
		}
		bs[i] = b
	}
	for _, b := range bs {
		b.tokens--
	}
	return true, 0
}

func (b *bucket) refill(rate, burst float64, now time.Time) {
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(burst, b.tokens+el.Seconds()*rate)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
}

// ceiling is the most sessions of a service with capacity slots one bucket may hold.
func (l *clientLimiter) ceiling(cb clientBucket, capacity int) int {
	c := math.MaxInt
	if l.maxSessions > 0 {
		c = l.maxSessions * int(l.factor(cb))
	}
	if l.share > 0 {
		c = min(c, max(1, int(l.share*float64(capacity))))
	}
	return c
}

// prune forgets the rate buckets that are full again and the held sets that hold nothing.
func (l *clientLimiter) prune(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, b := range l.buckets {
		f := 1.0
		if (k.Addr().Is4() && k.Bits() == 24) || (k.Addr().Is6() && k.Bits() == 48) {
			f = float64(l.wide)
		}
		if b.refill(l.rate*f, l.burst*f, now); b.tokens >= l.burst*f {
			delete(l.buckets, k)
		}
	}
	for k, h := range l.held {
		if h.count() == 0 {
			delete(l.held, k)
		}
	}
}

// clientClaim is a place under a client's ceilings taken for one new session: bind it to the
// session's id once the session exists, or release it. A nil claim does nothing.
type clientClaim struct {
	l    *clientLimiter
	sets []*heldSet
}

func (c *clientClaim) bind(id string) {
	c.settle(func(h *heldSet) { h.ids[id] = struct{}{} })
}

func (c *clientClaim) release() { c.settle(nil) }

// settle gives back the claim's pending places, first calling keep (when not nil) on each held
// set under the limiter's lock.
func (c *clientClaim) settle(keep func(*heldSet)) {
	if c == nil {
		return
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	for _, h := range c.sets {
		h.pending--
		if keep != nil {
			keep(h)
		}
	}
	c.sets = nil
}

// admitNewSession applies the per-client limits to a request about to open a session: on
// success it returns the claim the new session must bind (or release).
func (e *Engine) admitNewSession(ctx context.Context, st *svcState, peer string, now time.Time) (*clientClaim, *Reject) {
	l := e.limiter
	if l == nil {
		return nil, nil
	}
	cbs := l.clientBuckets(peer)
	if len(cbs) == 0 {
		return nil, nil
	}
	capacity := len(st.ids) * st.svc.SessionsPerInstance
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		sets, full := l.heldSetsLocked(st.svc.Name, cbs, capacity)
		if len(full) == 0 {
			claim, rej := l.claimLocked(st, cbs, sets, now)
			l.mu.Unlock()
			return claim, rej
		}
		// At a ceiling: once a second, ask the store which of the bucket's sessions still live.
		check, checkSets := dueForRecheckLocked(sets, full, now)
		l.mu.Unlock()
		if attempt > 0 || len(checkSets) == 0 {
			i := full[0]
			return nil, &Reject{Class: ClassTooManyRequests, Code: "ClientSessionLimit", RetryAfter: time.Second,
				Message: fmt.Sprintf("this client (%s) holds %d sessions of service %q, its ceiling; end some (DELETE, or let them idle out) or retry later",
					cbs[i].key, l.ceiling(cbs[i], capacity), st.svc.Name)}
		}
		gone := e.goneSessions(ctx, st.svc.Name, check)
		l.mu.Lock()
		for _, h := range checkSets {
			for _, id := range gone {
				delete(h.ids, id)
			}
		}
		l.mu.Unlock()
	}
}

// heldSetsLocked returns the held set of each of the client's buckets for service (creating
// the missing ones) and the indexes of those at their ceiling. l.mu must be held.
func (l *clientLimiter) heldSetsLocked(service string, cbs []clientBucket, capacity int) (sets []*heldSet, full []int) {
	sets = make([]*heldSet, len(cbs))
	for i, cb := range cbs {
		k := heldKey{service: service, client: cb.key}
		h := l.held[k]
		if h == nil {
			h = &heldSet{ids: map[string]struct{}{}}
			l.held[k] = h
		}
		sets[i] = h
		if h.count() >= l.ceiling(cb, capacity) {
			full = append(full, i)
		}
	}
	return sets, full
}

// claimLocked takes the client's rate tokens and a pending place in each of its held sets, or
// refuses a client over its rate. l.mu must be held.
func (l *clientLimiter) claimLocked(st *svcState, cbs []clientBucket, sets []*heldSet, now time.Time) (*clientClaim, *Reject) {
	if ok, wait := l.takeTokensLocked(cbs, now); !ok {
		return nil, l.rateReject(st, wait)
	}
	for _, h := range sets {
		h.pending++
	}
	return &clientClaim{l: l, sets: sets}, nil
}

// rateReject is the refusal of a client that opens new sessions faster than the limiter's
// rate; it may retry after wait (a second at least).
func (l *clientLimiter) rateReject(st *svcState, wait time.Duration) *Reject {
	return &Reject{Class: ClassTooManyRequests, Code: "NewSessionRateLimited", RetryAfter: max(wait, time.Second),
		Message: fmt.Sprintf("this client opened new sessions of service %q too fast (%g per second, burst %g); send the session id back (keep cookies) or retry later",
			st.svc.Name, l.rate, l.burst)}
}

// dueForRecheckLocked picks, of the full sets, those not checked against the store in the last
// heldRecheck (or checked in the future of now), marks them checked at now and returns them
// with the ids they hold. l.mu must be held.
func dueForRecheckLocked(sets []*heldSet, full []int, now time.Time) (check []string, checkSets []*heldSet) {
	for _, i := range full {
		if h := sets[i]; now.Sub(h.checked) >= heldRecheck || h.checked.After(now) {
			h.checked = now
			checkSets = append(checkSets, h)
			for id := range h.ids {
				check = append(check, id)
			}
		}
	}
	return check, checkSets
}

// goneSessions returns those of ids (sorted, without repeats) whose sessions of service are no
// longer Active in the store or are not found there. A store error keeps the session.
func (e *Engine) goneSessions(ctx context.Context, service string, ids []string) []string {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var gone []string
	for _, id := range ids {
		s, err := e.store.Get(ctx, service, id)
		if errors.Is(err, session.ErrNotFound) || err == nil && s.Status != session.StatusActive {
			gone = append(gone, id)
		}
	}
	return gone
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
