package affinity

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// Handle affinity (registry.MCPHandle) for the sessionless requests of an mcp-streamable
// service (MCP 2026-07-28 and later). A server that keeps cross-call state mints a handle and
// its clients mirror it in "Mcp-Param-{Header}" (the tool marks the parameter with
// x-mcp-header). Handles are sessions of kind mcp-handle: the same session slots, idle timeout
// and TTL as 2025-era sessions, listed, read and deleted through the SessionAPI like any
// session, and every request with a handle takes a request slot on the handle's instance.
//
// A handle routes only once tether has seen it minted — a client cannot choose its instance
// by writing a handle:
//
//   - A tools/call without a handle that may mint one (its Mcp-Name is in MintTools, or any
//     tools/call when MintTools is empty) is placed like a new session — the client's
//     new-session limits apply (NewSessionLimit) — holding a session slot until its response.
//   - With LearnHeader, a 2xx response naming a handle in that header binds it to the instance
//     that served it (a session record created from the minting response); none frees the slot.
//   - With InstancePrefix (the server embeds its instance id, "<id><PrefixSeparator>…", and no
//     learn header tells tether the handle), a 2xx mint leaves a mint credit on the instance
//     that served it, held for the minting client (its client bucket) for the service's idle
//     timeout (30 s without one) and counted under that client's session ceiling. A handle
//     tether has not bound yet binds to the instance its prefix names only by taking one of
//     that instance's credits of the same client: a handle nobody minted there, or one sent
//     by another client, is 404 HandleNotFound. Credits are this replica's: replicas sharing a
//     store should use LearnHeader (a first use on another replica is a 404, the signal to mint
//     again).
//   - Draining (and standby) instances get no new handle sessions: a mint is never placed on
//     one, a mint response served by one binds nothing, and a credit there cannot be used.
//   - Every other request without a handle (tools/list, other tools, notifications) is
//     balanced freely, as sessionless MCP is without handle affinity.
//
// An unknown handle — never minted, ended, or not decodable — is 404 HandleNotFound (the
// signal to mint a new one).

// decideHandle decides a sessionless MCP request.
func (e *Engine) decideHandle(ctx context.Context, st *svcState, req *Request, now time.Time) (*decision, error) {
	h := st.svc.MCPHandle
	stream := isStream(req)
	if h.Header == "" {
		if stream && st.streams != nil {
			return e.freeStream(ctx, st, now)
		}
		return e.freeDecision(ctx, st, req, now)
	}
	if handle := req.Header("mcp-param-" + strings.ToLower(h.Header)); handle != "" {
		handle, ok := decodeParamValue(handle)
		if !ok {
			return nil, handleNotFound(st, "the handle's =?base64?…?= form does not decode")
		}
		return e.routeHandle(ctx, st, handle, ClientBucket(req.Peer), stream, now)
	}
	if !mintsHandle(h.MintTools, req) {
		if stream && st.streams != nil {
			return e.freeStream(ctx, st, now)
		}
		return e.freeDecision(ctx, st, req, now)
	}
	d, rej := e.openProvisional(ctx, st, req.Peer, true, now)
	if rej != nil {
		return nil, rej
	}
	d.client = ClientBucket(req.Peer)
	if h.LearnHeader == "" {
		d.h = mintOnly{} // a prefix handle binds on first use
	} else {
		d.h = mcpInit{header: strings.ToLower(h.LearnHeader), kind: session.KindMCPHandle}
	}
	return d, nil
}

// mintOnly: a mint whose handle is bound on first use (InstancePrefix without a learn header):
// the provisional slot only kept the mint on an instance with room, and is freed with the
// response; a 2xx leaves a mint credit on the instance that served it, holding the client's
// claim (see the package's handle rules above).
type mintOnly struct{ plainExchange }

func (mintOnly) respond(d *decision, resp Response) []HeaderValue {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.provisional && resp.Status/100 == 2 {
		idx := d.provIdx
		if i, ok := d.servedIndex(resp); ok {
			idx = i
		}
		if d.st.placeable[idx] {
			d.e.credits.add(d.st, idx, d.client, d.claim, d.e.now())
			d.claim = nil // the credit holds it now
		}
	}
	d.releaseProvisionalLocked()
	return nil
}

func (mintOnly) end(d *decision) {
	d.releaseProvisional()
}

// mintsHandle reports whether a handle-less request may mint a handle: a tools/call whose tool
// is one of tools (any tool when tools is empty).
func mintsHandle(tools []string, req *Request) bool {
	if req.Method != "POST" || req.Header("mcp-method") != "tools/call" {
		return false
	}
	return len(tools) == 0 || slices.Contains(tools, req.Header("mcp-name"))
}

// Mcp-Param values that are not plain visible ASCII (or that look like the encoded form) are
// sent as "=?base64?{standard base64 of the UTF-8 value}?=" (MCP 2026-07-28, Streamable HTTP,
// custom headers; the TS SDK 2.x client's encodeMcpParamValue).
const (
	paramB64Prefix = "=?base64?"
	paramB64Suffix = "?="
)

// decodeParamValue returns an Mcp-Param header value as the tool argument it mirrors: an
// encoded value decoded, any other value as it is. ok is false for an encoded value whose
// payload is not valid base64.
func decodeParamValue(v string) (string, bool) {
	if len(v) < len(paramB64Prefix)+len(paramB64Suffix) || !strings.HasPrefix(v, paramB64Prefix) || !strings.HasSuffix(v, paramB64Suffix) {
		return v, true
	}
	b, err := base64.StdEncoding.DecodeString(v[len(paramB64Prefix) : len(v)-len(paramB64Suffix)])
	if err != nil {
		return "", false
	}
	return string(b), true
}

// routeHandle routes a request carrying a handle (decoded from its Mcp-Param form) from the
// client bucket client.
func (e *Engine) routeHandle(ctx context.Context, st *svcState, handle, client string, stream bool, now time.Time) (*decision, error) {
	if !validMCPID(handle) {
		return nil, handleNotFound(st, "the handle is not a valid token (visible ASCII, at most 512 bytes)")
	}
	d, err := e.routeMCP(ctx, st, handle, stream, now)
	var rej *Reject
	if err == nil || !errors.As(err, &rej) || rej.Class != ClassNotFound {
		return d, err
	}
	h := st.svc.MCPHandle
	if !h.InstancePrefix {
		return nil, handleNotFound(st, "unknown handle")
	}
	inst, _, ok := strings.Cut(handle, h.PrefixSeparator)
	idx, known := st.byID[inst]
	if !ok || !known || !st.placeable[idx] {
		return nil, handleNotFound(st, "the handle names no instance taking new handles")
	}
	claim, ok := e.credits.take(st, idx, client, now)
	if !ok {
		return nil, handleNotFound(st, "no handle was minted on "+inst+" for this client")
	}
	d, err = e.bindOn(ctx, st, handle, idx, stream, now)
	if err != nil || !d.newSession {
		claim.release()
		return d, err
	}
	claim.bind(handle)
	return d, nil
}

// mintCredits are the prefix-handle mints (InstancePrefix without LearnHeader) whose handles
// are not bound yet, per (service, instance, client bucket); each lets one unknown handle with
// that instance's prefix bind from that client. The zero value is ready; safe for concurrent
// use.
type mintCredits struct {
	mu sync.Mutex
	m  map[creditKey][]mintCredit
	n  int
}

type creditKey struct{ service, instance, client string }

type mintCredit struct {
	claim   *clientClaim
	expires time.Time
}

// maxMintCredits bounds the credits kept (per replica); a mint beyond it leaves none (its
// handle's first use is a 404: mint again).
const maxMintCredits = 100_000

// creditTTL is how long a mint credit waits for its handle's first use.
func creditTTL(st *svcState) time.Duration {
	if st.svc.IdleTimeout > 0 {
		return st.svc.IdleTimeout
	}
	return 30 * time.Second
}

func (c *mintCredits) add(st *svcState, idx int, client string, claim *clientClaim, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= maxMintCredits {
		claim.release()
		return
	}
	if c.m == nil {
		c.m = map[creditKey][]mintCredit{}
	}
	k := creditKey{st.svc.Name, st.ids[idx], client}
	c.m[k] = append(c.m[k], mintCredit{claim: claim, expires: now.Add(creditTTL(st))})
	c.n++
}

// take removes the oldest live credit of (service, instance, client) and returns its claim.
func (c *mintCredits) take(st *svcState, idx int, client string, now time.Time) (*clientClaim, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := creditKey{st.svc.Name, st.ids[idx], client}
	list := c.m[k]
	for len(list) > 0 {
		cr := list[0]
		list = list[1:]
		c.n--
		if now.Before(cr.expires) {
			c.set(k, list)
			return cr.claim, true
		}
		cr.claim.release()
	}
	c.set(k, list)
	return nil, false
}

func (c *mintCredits) set(k creditKey, list []mintCredit) {
	if len(list) == 0 {
		delete(c.m, k)
	} else {
		c.m[k] = list
	}
}

// prune drops expired credits, releasing their claims.
func (c *mintCredits) prune(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, list := range c.m {
		keep := list[:0]
		for _, cr := range list {
			if now.Before(cr.expires) {
				keep = append(keep, cr)
			} else {
				cr.claim.release()
				c.n--
			}
		}
		c.set(k, keep)
	}
}

// bindOn creates the session id on instance idx (a handle whose instance is known), with a
// session and a request slot there.
func (e *Engine) bindOn(ctx context.Context, st *svcState, id string, idx int, stream bool, now time.Time) (*decision, error) {
	rec := e.newRecord(st, id, idx, session.KindMCPHandle, now)
	if e.slotStore != nil {
		capS, _ := st.slots[idx].Caps()
		cands := []session.PlaceCandidate{{Instance: st.ids[idx], Standby: !st.placeable[idx], Cap: capS}}
		if _, _, err := e.slotStore.PlaceCreate(ctx, rec, cands); err != nil {
			if errors.Is(err, session.ErrNoRoom) {
				return nil, e.handleNoRoom(st, idx)
			}
			if errors.Is(err, session.ErrExists) {
				return e.routeMCP(ctx, st, id, stream, now) // bound concurrently
			}
			return nil, fmt.Errorf("affinity: binding a handle: %w", err)
		}
		t, rej := e.admitFor(ctx, st, idx, stream)
		if rej != nil {
			return nil, rej
		}
		return e.newDecision(st, idx, t, id, true, now), nil
	}
	if !st.slots[idx].TryAcquireSession() {
		return nil, e.handleNoRoom(st, idx)
	}
	t, rej := e.admitFor(ctx, st, idx, stream)
	if rej != nil {
		st.slots[idx].ReleaseSession()
		return nil, rej
	}
	if err := e.store.Create(ctx, rec); err != nil {
		st.slots[idx].ReleaseSession()
		t.Release()
		if errors.Is(err, session.ErrExists) {
			return e.routeMCP(ctx, st, id, stream, now)
		}
		return nil, fmt.Errorf("affinity: binding a handle: %w", err)
	}
	return e.newDecision(st, idx, t, id, true, now), nil
}

func (e *Engine) handleNoRoom(st *svcState, idx int) *Reject {
	return e.reject(ClassNoCapacity, "NoCapacity",
		fmt.Sprintf("instance %q of service %q has no free session slot for another handle", st.ids[idx], st.svc.Name))
}

func handleNotFound(st *svcState, why string) *Reject {
	return &Reject{Class: ClassNotFound, Code: "HandleNotFound",
		Message: fmt.Sprintf("MCP handle not found on service %q (%s); mint a new one", st.svc.Name, why)}
}
