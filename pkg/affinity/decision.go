package affinity

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// exchange is what a mode does with an admitted exchange after Decide: on the response, with a
// session id found in the response body, and at its end. Each mode's file defines the
// exchanges it uses (stateless types; the state lives in the decision); plainExchange is the
// do-nothing part they embed. A decision without one (h nil) only holds its request slot.
type exchange interface {
	respond(d *decision, resp Response) []HeaderValue
	wantsBody() bool
	learn(d *decision, id string) error
	// end runs once, after the request slot is released.
	end(d *decision)
	// touchID is a session the open exchange keeps fresh besides d.sessionID ("" for none).
	touchID(d *decision) string
}

// plainExchange does nothing.
type plainExchange struct{}

func (plainExchange) respond(*decision, Response) []HeaderValue { return nil }
func (plainExchange) wantsBody() bool                           { return false }
func (plainExchange) learn(*decision, string) error {
	return fmt.Errorf("affinity: this exchange announces no session: %w", ErrUnsupported)
}
func (plainExchange) end(*decision)            {}
func (plainExchange) touchID(*decision) string { return "" }

// decision implements Decision.
type decision struct {
	e      *Engine
	st     *svcState
	idx    int
	ticket *balance.Ticket // nil for SIP decisions
	start  time.Time

	sessionID  string
	newSession bool
	hashKey    string   // the key a hash decision looked up ("" otherwise)
	h          exchange // the mode's part; nil for none
	// stream: a long-lived exchange (an SSE response, the MCP SSE GET): the leak guard gives
	// it the service's maxLifetime rather than the engine's request lifetime.
	stream atomic.Bool
	// expired: the exchange outlived its limit and was told to end (once). Its slot stays held
	// until End.
	expired atomic.Bool

	ended atomic.Bool
	// handedOff: the exchange went on without tether (HandOff); what it learned stays.
	handedOff atomic.Bool

	mu sync.Mutex // guards the fields below (learning races with End from other goroutines)
	// provisional: the decision holds a session slot on idx for a session not created yet
	// (MCP initialize, SSE GET) that End releases unless a session took it over.
	provisional bool
	provIdx     int // the instance holding the provisional slot
	// rsv, when held, is the provisional slot as a reservation in the shared store (with
	// shared slots): no slot of this process's counters is taken then.
	rsv session.Reservation
	// claim is the client's place under its session ceilings (limit.go) that the provisional
	// session binds when created, or releases.
	claim   *clientClaim
	client  string // the client bucket of a handle mint (ClientBucket of its peer)
	learned string // MCP SSE: the id LearnSession bound; its session ends with End
	expirer Expirer

	// open set links, guarded by shard.mu
	shard      *openShard
	prev, next *decision
}

var _ Decision = (*decision)(nil)

// newDecision builds a decision. Decide registers it as open once the mode has finished
// setting it up (so the sweeper never sees a half-built decision).
func (e *Engine) newDecision(st *svcState, idx int, t *balance.Ticket, id string, isNew bool, now time.Time) *decision {
	return &decision{e: e, st: st, idx: idx, ticket: t, start: now, sessionID: id, newSession: isNew}
}

func (d *decision) Instance() registry.Instance { return d.st.insts[d.idx] }
func (d *decision) SessionID() string           { return d.sessionID }
func (d *decision) NewSession() bool            { return d.newSession }

// HashKey is the key a SIP hash decision looked up on the ring ("" for other decisions): what
// a dialog's failover token carries.
func (d *decision) HashKey() string         { return d.hashKey }
func (d *decision) WantsResponseBody() bool { return d.h != nil && d.h.wantsBody() }

// SSESessionParam names the query parameter of the MCP SSE endpoint URI that carries the
// session id (the service's sse.sessionParam), so the body parser reads the configured one.
func (d *decision) SSESessionParam() string { return d.st.svc.SSE.SessionParam }

func (d *decision) OnResponse(resp Response) []HeaderValue {
	if isEventStream(resp.Header("content-type")) {
		d.stream.Store(true)
	}
	if d.h == nil {
		return nil
	}
	return d.h.respond(d, resp)
}

// servedIndex maps the host the data plane reports it used to an instance of the service.
func (d *decision) servedIndex(resp Response) (int, bool) {
	if resp.ServedHost == "" || resp.ServedHost == d.st.insts[d.idx].HTTPAddr() {
		return d.idx, resp.ServedHost != ""
	}
	for i, in := range d.st.insts {
		if in.HTTPAddr() == resp.ServedHost {
			d.e.log.Warn("affinity: the data plane served another instance than chosen", "service", d.st.svc.Name,
				"chosen", d.st.ids[d.idx], "served", in.ID)
			return i, true
		}
	}
	return d.idx, false
}

// moveProvisionalLocked moves the provisional session slot to the instance that really served
// the exchange (counted even above its cap: the session lives there). d.mu must be held.
func (d *decision) moveProvisionalLocked(i int) {
	if !d.provisional {
		return
	}
	if d.rsv.Held() { // the binding takes the reservation's slot onto the served instance
		d.provIdx = i
		return
	}
	d.st.slots[d.provIdx].ReleaseSession()
	d.st.slots[i].AddSessions(1)
	d.provIdx = i
}

// releaseProvisional frees the provisional slot, taking d.mu.
func (d *decision) releaseProvisional() {
	d.mu.Lock()
	d.releaseProvisionalLocked()
	d.mu.Unlock()
}

// releaseProvisionalLocked frees the provisional slot. d.mu must be held.
func (d *decision) releaseProvisionalLocked() {
	if !d.provisional {
		return
	}
	d.provisional = false
	d.claim.release()
	d.claim = nil
	if d.rsv.Held() {
		d.e.releaseReservation(d.st, d.rsv)
		d.rsv = session.Reservation{}
		return
	}
	d.st.slots[d.provIdx].ReleaseSession()
}

// LearnSession binds a session id announced in the response body (MCP SSE).
func (d *decision) LearnSession(id string) error {
	if d.h == nil {
		return plainExchange{}.learn(d, id)
	}
	return d.h.learn(d, id)
}

// End releases the request slot (once) and lets the mode end what the exchange still holds (a
// provisional session slot, the MCP SSE session of its GET stream).
func (d *decision) End() {
	if !d.ended.CompareAndSwap(false, true) {
		return
	}
	if d.shard != nil {
		d.e.open.remove(d)
	}
	if d.ticket != nil {
		d.ticket.Release()
	}
	if d.h != nil {
		d.h.end(d)
	}
}

// ErrNotHandedOff is HandOff's error when the decision had already ended.
var ErrNotHandedOff = errors.New("affinity: the decision already ended")

// HandOff implements Decision: End for an exchange that goes on without tether, its request
// slot kept until the exchange's bound (see Decision).
func (d *decision) HandOff(ctx context.Context) error {
	if d.ended.Load() {
		return ErrNotHandedOff
	}
	if d.ticket != nil {
		if err := d.ticket.Detach(ctx, d.handOffBound()); err != nil {
			return fmt.Errorf("affinity: handing the exchange's request slot off: %w", err)
		}
	}
	d.handedOff.Store(true)
	d.End() // the ticket is detached: End releases nothing more of it
	return nil
}

// handOffBound is how much longer a handed-off exchange can last: its service's maxLifetime
// from its start (at least 1 ms: the data plane ends it then, if it has not yet), or 0 when
// the service has none (unbounded).
func (d *decision) handOffBound() time.Duration {
	lt := d.st.svc.MaxLifetime
	if lt <= 0 {
		return 0
	}
	return max(lt-d.e.now().Sub(d.start), time.Millisecond)
}

// OnExpire sets who ends the exchange when it outlives its limit.
func (d *decision) OnExpire(x Expirer) {
	d.mu.Lock()
	d.expirer = x
	d.mu.Unlock()
}

// expire tells the exchange to end, once: the slot stays held until End.
func (d *decision) expire() bool {
	if d.expired.Swap(true) {
		return false
	}
	d.mu.Lock()
	x := d.expirer
	d.mu.Unlock()
	if x != nil {
		x.Expire()
	}
	return true
}

// limit is how long the exchange may stay open: a stream its service's maxLifetime (0: no
// bound, as Envoy's route has no max_stream_duration then), any other exchange the engine's
// request lifetime.
func (d *decision) limit() time.Duration {
	if d.stream.Load() {
		return d.st.svc.MaxLifetime
	}
	return d.e.maxRequestLifetime
}

// isEventStream reports whether a content type is text/event-stream (an SSE response).
func isEventStream(ct string) bool {
	if len(ct) < len("text/event-stream") {
		return false
	}
	return strings.EqualFold(ct[:len("text/event-stream")], "text/event-stream")
}

// touchID is the session whose idle timer an open exchange keeps fresh ("" for none).
func (d *decision) touchID() string {
	if d.sessionID != "" {
		return d.sessionID
	}
	if d.h != nil {
		return d.h.touchID(d)
	}
	return ""
}

// openShards spreads open decisions over this many locks.
const openShards = 64

// openSet tracks the decisions holding a request slot: intrusive lists, no allocation.
type openSet struct {
	shards [openShards]openShard
}

type openShard struct {
	mu   sync.Mutex
	head *decision
	_    [48]byte // keep shards on separate cache lines
}

func (o *openSet) add(d *decision) {
	sh := &o.shards[rand.Uint32()%openShards]
	d.shard = sh
	sh.mu.Lock()
	d.next = sh.head
	if sh.head != nil {
		sh.head.prev = d
	}
	sh.head = d
	sh.mu.Unlock()
}

func (o *openSet) remove(d *decision) {
	sh := d.shard
	sh.mu.Lock()
	if d.prev != nil {
		d.prev.next = d.next
	} else if sh.head == d {
		sh.head = d.next
	}
	if d.next != nil {
		d.next.prev = d.prev
	}
	d.prev, d.next = nil, nil
	sh.mu.Unlock()
}

// collect returns the open decisions for which keep reports true.
func (o *openSet) collect(keep func(*decision) bool) []*decision {
	var out []*decision
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for d := sh.head; d != nil; d = d.next {
			if keep(d) {
				out = append(out, d)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// endSession ends every open decision of a session except one.
func (o *openSet) endSession(service, id string, except *decision) {
	for _, d := range o.collect(func(d *decision) bool {
		return d != except && d.sessionID == id && d.st.svc.Name == service
	}) {
		d.End()
	}
}

// sweep enforces the exchange limits and keeps the sessions of open exchanges from idling
// out. An exchange past its limit, or on a shared request-slot lease past its fence
// (balance.Ticket.Fenced), is told to end (Expirer), counted and logged; its request
// slot is freed only by its End, when the exchange really ends: the guard never frees the
// slot of a live stream, so the request cap holds.
func (e *Engine) sweep(ctx context.Context) {
	now := e.now()
	type touch struct{ service, id string }
	var touches []touch
	over := e.open.collect(func(d *decision) bool {
		if id := d.touchID(); id != "" {
			touches = append(touches, touch{d.st.svc.Name, id})
		}
		l := d.limit()
		return (l > 0 && now.Sub(d.start) >= l || d.ticket.Fenced()) && !d.expired.Load()
	})
	for _, t := range touches {
		e.store.Touch(ctx, t.service, t.id, now)
	}
	for _, d := range over {
		if !d.expire() {
			continue
		}
		e.expiredCount.Add(1)
		if d.ticket.Fenced() {
			e.log.Warn("affinity: the request-slot lease of this exchange lapsed (Redis unreachable past store.redis.degradedFor); ending it so that the cap holds",
				"service", d.st.svc.Name, "instance", d.st.ids[d.idx], "session", d.sessionID)
			continue
		}
		e.log.Warn("affinity: exchange outlived its limit; ending it (its slot is freed when it ends)",
			"service", d.st.svc.Name, "instance", d.st.ids[d.idx], "session", d.sessionID,
			"stream", d.stream.Load(), "limit", d.limit().String(), "age", now.Sub(d.start).String())
	}
	if e.limiter != nil {
		e.limiter.prune(now)
	}
	e.credits.prune(now)
	e.pruneSlots()
}

// pruneSlots forgets counters of removed instances that nothing counts on any more.
func (e *Engine) pruneSlots() {
	v := e.view.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, sl := range e.slots {
		if st := v.services[k.Service]; st != nil {
			if _, ok := st.byID[k.ID]; ok {
				continue
			}
		}
		if sl.Sessions() == 0 && sl.Requests() == 0 {
			delete(e.slots, k)
		}
	}
}

// newRecord builds a new Active session record with the service's defaults.
func (e *Engine) newRecord(st *svcState, id string, idx int, kind session.Kind, now time.Time) session.Session {
	return session.Session{
		ID:           id,
		Service:      st.svc.Name,
		Instance:     st.ids[idx],
		Kind:         kind,
		Created:      now,
		LastModified: now,
		LastSeen:     now,
		TTL:          st.svc.SessionTTL,
		IdleTimeout:  st.svc.IdleTimeout,
		Status:       session.StatusActive,
		DisableReuse: st.svc.DisableSessionIDReuse,
	}
}
