package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// sessionlessMCPVersion is the first MCP protocol revision without sessions.
const sessionlessMCPVersion = "2026-07-28"

// mcpSessionless reports whether a request belongs to the sessionless MCP era: its
// MCP-Protocol-Version is 2026-07-28 or later, or it declares (Mcp-Method) server/discover.
// The engine sees headers only, never bodies, so a server/discover without the Mcp-Method
// header is not recognised as such (it carries no Mcp-Session-Id and is placed as an
// initialize; a stateful server answers it without a session id, which frees the slot).
func mcpSessionless(req *Request) bool {
	if v := req.Header("mcp-protocol-version"); isDate(v) && v >= sessionlessMCPVersion {
		return true
	}
	return req.Header("mcp-method") == "server/discover"
}

// isDate reports whether s looks like YYYY-MM-DD.
func isDate(s string) bool {
	if len(s) != 10 || s[4] != '-' || s[7] != '-' {
		return false
	}
	for i := 0; i < 10; i++ {
		if i == 4 || i == 7 {
			continue
		}
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// sseParams are the query parameters HTTP+SSE servers put their session id in.
var sseParams = [...]string{"sessionId", "session_id", "sessionid"}

// sseStyle reports whether a request without Mcp-Session-Id looks like HTTP+SSE traffic.
func sseStyle(st *svcState, req *Request) bool {
	path, query := splitPath(req.Path)
	if req.Method == "GET" && path == st.svc.SSE.Path {
		return true
	}
	if query == "" {
		return false
	}
	if _, ok := queryParam(query, st.svc.SSE.SessionParam); ok {
		return true
	}
	for _, p := range sseParams {
		if _, ok := queryParam(query, p); ok {
			return true
		}
	}
	return false
}

// routeMCP routes a request of a known MCP session to its instance; anything else is 404, the
// protocol's signal to start a new session.
// A stream (isStream) takes a stream slot rather than a request slot.
func (e *Engine) routeMCP(ctx context.Context, st *svcState, id string, stream bool, now time.Time) (*decision, error) {
	if !validMCPID(id) {
		return nil, mcpNotFound(st, "the session id is not a valid MCP session id")
	}
	s, err := e.store.Get(ctx, st.svc.Name, id)
	switch {
	case errors.Is(err, session.ErrNotFound):
		return nil, mcpNotFound(st, "unknown session")
	case errors.Is(err, session.ErrStoreUnavailable):
		return nil, e.storeUnreadable(st, err)
	case err != nil:
		return nil, fmt.Errorf("affinity: reading MCP session: %w", err)
	case s.Status != session.StatusActive:
		return nil, mcpNotFound(st, "the session has ended")
	}
	idx, ok := st.byID[s.Instance]
	if !ok || !st.routable[idx] {
		e.terminate(ctx, st.svc.Name, id, "instance lost", nil)
		return nil, mcpNotFound(st, "the instance that held the session is gone")
	}
	t, rej := e.admitFor(ctx, st, idx, stream)
	if rej != nil {
		return nil, rej
	}
	e.store.Touch(ctx, st.svc.Name, id, now)
	d := e.newDecision(st, idx, t, id, false, now)
	if stream && st.streams != nil {
		d.stream.Store(true)
	}
	return d, nil
}

func mcpNotFound(st *svcState, why string) *Reject {
	return &Reject{Class: ClassNotFound, Code: "SessionNotFound",
		Message: fmt.Sprintf("MCP session not found on service %q (%s); start a new session", st.svc.Name, why)}
}
