package affinity

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// Handle affinity (registry.MCPHandle) for the sessionless requests of an mcp-streamable
// service (MCP 2026-07-28 and later). A server that keeps cross-call state mints a handle and
// its clients mirror it in "Mcp-Param-{Header}" (the tool marks the parameter with
// x-mcp-header). Handles are sessions of kind mcp-handle: the same session slots, idle timeout
// and TTL as 2025-era sessions, and every request with a handle takes a request slot on the
// handle's instance.
//
//   - A request with a handle goes to the handle's instance. A handle tether has not bound yet
//     is bound to the instance its prefix names (InstancePrefix), taking a session slot there
//     (503 when the instance has none free); without InstancePrefix it is 404 HandleNotFound,
//     the signal to mint a new one. A prefix handle thus takes its slot at its first use, not
//     at its mint: mints placed while earlier handles are still unused all see free slots,
//     and the later first uses find the instance full (503). A learned handle holds its slot
//     from the mint's response on.
//   - A tools/call without a handle that may mint one (its Mcp-Name is in MintTools, or any
//     tools/call when MintTools is empty) is placed like a new session, holding a session slot
//     until its response: a handle in the LearnHeader response header binds to the instance
//     that served it and keeps the slot; no handle frees it.
//   - Every other request without a handle (tools/list, other tools, notifications) is
//     balanced freely, as sessionless MCP is without handle affinity.
//
// A client that writes a handle with some instance's prefix reaches that instance: with
// InstancePrefix the prefix is the routing key, as an instance id embedded in a session id is
// for any proxy that honours it. Use LearnHeader where clients must never pick an instance.

// decideHandle decides a sessionless MCP request.
func (e *Engine) decideHandle(ctx context.Context, st *svcState, req *Request, now time.Time) (*decision, error) {
	h := st.svc.MCPHandle
	stream := isStream(req)
	if h.Header == "" {
		if stream && st.streams != nil {
			return e.freeStream(st, now)
		}
		return e.freeDecision(st, req, now)
	}
	if handle := req.Header("mcp-param-" + strings.ToLower(h.Header)); handle != "" {
		handle, ok := decodeParamValue(handle)
		if !ok {
			return nil, handleNotFound(st, "the handle's =?base64?…?= form does not decode")
		}
		return e.routeHandle(ctx, st, handle, stream, now)
	}
	if !mintsHandle(h.MintTools, req) {
		if stream && st.streams != nil {
			return e.freeStream(st, now)
		}
		return e.freeDecision(st, req, now)
	}
	idx, t, rsv, rej := e.placeProvisional(ctx, st, true)
	if rej != nil {
		return nil, rej
	}
	d := e.newDecision(st, idx, t, "", true, now)
	d.provisional, d.provIdx, d.rsv = true, idx, rsv
	if h.LearnHeader == "" {
		d.h = mintOnly{} // a prefix handle binds on first use
	} else {
		d.h = mcpInit{header: strings.ToLower(h.LearnHeader), kind: session.KindMCPHandle}
	}
	return d, nil
}

// mintOnly: a mint whose handle is bound on first use (InstancePrefix without a learn header):
// the provisional slot only kept the mint on an instance with room, and is freed with the
// response.
type mintOnly struct{ plainExchange }

func (mintOnly) respond(d *decision, _ Response) []HeaderValue {
	d.mu.Lock()
	d.releaseProvisionalLocked()
	d.mu.Unlock()
	return nil
}

func (mintOnly) end(d *decision) {
	d.mu.Lock()
	d.releaseProvisionalLocked()
	d.mu.Unlock()
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

// routeHandle routes a request carrying a handle (decoded from its Mcp-Param form).
func (e *Engine) routeHandle(ctx context.Context, st *svcState, handle string, stream bool, now time.Time) (*decision, error) {
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
	if !ok || !known || !st.routable[idx] {
		return nil, handleNotFound(st, "the handle names no live instance")
	}
	return e.bindOn(ctx, st, handle, idx, stream, now)
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
		t, rej := e.admitFor(st, idx, stream)
		if rej != nil {
			return nil, rej
		}
		return e.newDecision(st, idx, t, id, true, now), nil
	}
	if !st.slots[idx].TryAcquireSession() {
		return nil, e.handleNoRoom(st, idx)
	}
	t, rej := e.admitFor(st, idx, stream)
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
