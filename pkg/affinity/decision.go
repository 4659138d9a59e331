package affinity

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// respAction is what OnResponse does for a decision.
type respAction uint8

const (
	respNone          respAction = iota
	respSetCookie                // cookie affinity: issue the session cookie
	respEchoHeader               // header affinity: return the generated id in the header field
	respStickyNew                // sticky round robin: maybe create a sticky session and cookie
	respStickyReissue            // sticky round robin: the session moved; re-issue its cookie
	respMCPInit                  // MCP streamable: learn Mcp-Session-Id, else free the provisional slot
	respMCPDelete                // MCP streamable DELETE: end the session on 2xx/404
	respSSEGet                   // MCP SSE GET: the body will announce the session (LearnSession)
)

// decision implements Decision.
type decision struct {
	e      *Engine
	st     *svcState
	idx    int
	ticket *balance.Ticket // nil for SIP decisions
	start  time.Time

	sessionID  string
	newSession bool
	resp       respAction

	ended atomic.Bool

	mu sync.Mutex // guards the fields below (learning races with End from other goroutines)
	// provisional: the decision holds a session slot on idx for a session not created yet
	// (MCP initialize, SSE GET) that End releases unless a session took it over.
	provisional bool
	provIdx     int    // the instance holding the provisional slot
	learned     string // MCP SSE: the id LearnSession bound; its session ends with End

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
func (d *decision) WantsResponseBody() bool     { return d.resp == respSSEGet }

// SSESessionParam names the query parameter of the MCP SSE endpoint URI that carries the
// session id (the service's sse.sessionParam), so the body parser reads the configured one.
func (d *decision) SSESessionParam() string { return d.st.svc.SSE.SessionParam }

func (d *decision) OnResponse(resp Response) []HeaderValue {
	svc := &d.st.svc
	switch d.resp {
	case respSetCookie:
		return []HeaderValue{{Name: "set-cookie", Value: setCookie(svc.Cookie, d.sessionID, svc.SessionTTL), Append: true}}
	case respEchoHeader:
		return []HeaderValue{{Name: svc.HeaderField, Value: d.sessionID}}
	case respStickyReissue:
		return []HeaderValue{{Name: "set-cookie", Value: setCookie(svc.Cookie, d.sessionID, svc.SessionTTL), Append: true}}
	case respStickyNew:
		return d.stickyLearn(resp)
	case respMCPInit:
		d.mcpLearn(resp)
	case respMCPDelete:
		if resp.Status/100 == 2 || resp.Status == 404 {
			d.e.terminate(context.Background(), svc.Name, d.sessionID, "MCP DELETE", d)
		}
	case respSSEGet:
		if i, ok := d.servedIndex(resp); ok {
			d.mu.Lock()
			if i != d.provIdx {
				d.moveProvisionalLocked(i)
			}
			d.mu.Unlock()
		}
	}
	return nil
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
	d.st.slots[d.provIdx].ReleaseSession()
	d.st.slots[i].AddSessions(1)
	d.provIdx = i
}

// stickyLearn creates the sticky session after a new request's response when the upstream set
// the configured cookie (or always, when none is configured).
func (d *decision) stickyLearn(resp Response) []HeaderValue {
	svc := &d.st.svc
	if svc.Sticky.UpstreamCookie != "" && !setsCookie(resp.Headers["set-cookie"], svc.Sticky.UpstreamCookie) {
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

// mcpLearn binds the Mcp-Session-Id of an initialize response to the instance that served it;
// without one the provisional session slot is freed.
func (d *decision) mcpLearn(resp Response) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.provisional {
		return
	}
	id := firstHeader(resp.Headers, "mcp-session-id")
	if id == "" || resp.Status/100 != 2 {
		d.releaseProvisionalLocked()
		return
	}
	if !validMCPID(id) {
		d.e.log.Warn("affinity: ignoring an invalid Mcp-Session-Id from upstream", "service", d.st.svc.Name, "instance", d.st.ids[d.idx])
		d.releaseProvisionalLocked()
		return
	}
	if i, ok := d.servedIndex(resp); ok && i != d.provIdx {
		d.moveProvisionalLocked(i)
	}
	idx := d.provIdx
	if err := d.e.store.Create(context.Background(), d.e.newRecord(d.st, id, idx, session.KindMCPStreamable, d.e.now())); err != nil {
		d.e.log.Error("affinity: binding an MCP session", "service", d.st.svc.Name, "session", id, "err", err)
		d.st.slots[idx].ReleaseSession()
		d.provisional = false
		return
	}
	d.provisional = false // the session owns the slot now; SessionEnded frees it
}

// releaseProvisionalLocked frees the provisional slot. d.mu must be held.
func (d *decision) releaseProvisionalLocked() {
	if !d.provisional {
		return
	}
	d.st.slots[d.provIdx].ReleaseSession()
	d.provisional = false
}

// LearnSession binds the MCP SSE session id announced in the response body.
func (d *decision) LearnSession(id string) error {
	if d.resp != respSSEGet {
		return fmt.Errorf("affinity: this exchange announces no session: %w", ErrUnsupported)
	}
	if !validMCPID(id) {
		return fmt.Errorf("affinity: SSE session id %q: %w", id, ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.learned != "" {
		return fmt.Errorf("affinity: SSE stream already bound to session %q: %w", d.learned, ErrInvalidArgument)
	}
	if !d.provisional {
		return fmt.Errorf("affinity: SSE stream already ended: %w", ErrInvalidArgument)
	}
	if err := d.e.store.Create(context.Background(), d.e.newRecord(d.st, id, d.provIdx, session.KindMCPSSE, d.e.now())); err != nil {
		return fmt.Errorf("affinity: binding SSE session %q: %w", id, err)
	}
	d.provisional = false
	d.learned = id
	return nil
}

// End releases the request slot (once) and ends what the exchange still holds: a provisional
// session slot, or the MCP SSE session of its GET stream.
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
	if d.resp != respMCPInit && d.resp != respSSEGet {
		return
	}
	d.mu.Lock()
	d.releaseProvisionalLocked()
	learned := d.learned
	d.mu.Unlock()
	if learned != "" {
		if _, err := d.e.store.End(context.Background(), d.st.svc.Name, learned, session.StatusTerminated, d.e.now()); err != nil &&
			!errors.Is(err, session.ErrEnded) && !errors.Is(err, session.ErrNotFound) {
			d.e.log.Error("affinity: ending an SSE session", "service", d.st.svc.Name, "session", learned, "err", err)
		}
	}
}

// touchID is the session whose idle timer an open exchange keeps fresh ("" for none).
func (d *decision) touchID() string {
	if d.sessionID != "" {
		return d.sessionID
	}
	if d.resp == respSSEGet {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.learned
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

// sweep enforces the leak guard and keeps the sessions of open exchanges from idling out.
func (e *Engine) sweep(ctx context.Context) {
	now := e.now()
	type touch struct{ service, id string }
	var touches []touch
	leaked := e.open.collect(func(d *decision) bool {
		if now.Sub(d.start) >= e.maxRequestLifetime {
			return true
		}
		if id := d.touchID(); id != "" {
			touches = append(touches, touch{d.st.svc.Name, id})
		}
		return false
	})
	for _, t := range touches {
		e.store.Touch(ctx, t.service, t.id, now)
	}
	for _, d := range leaked {
		e.log.Warn("affinity: request not ended within the maximum request lifetime; releasing its slot",
			"service", d.st.svc.Name, "instance", d.st.ids[d.idx], "session", d.sessionID,
			"age", now.Sub(d.start).String())
		d.End()
	}
	e.pruneSlots()
	_ = ctx
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
