package affinity

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// mcpStreamableMode is MCP Streamable HTTP affinity (2025-03-26, 2025-06-18, 2025-11-25): an
// initialize is placed with a provisional session slot that its response's Mcp-Session-Id
// turns into a session; requests with the id go to its instance, else 404; a DELETE ends it.
// HTTP only; the MCP client and server own the sessions (no SessionAPI); sessions of a lost
// instance end.
var mcpStreamableMode = mode{
	affinity:          registry.AffinityMCPStreamable,
	name:              "mcp-streamable",
	http:              true,
	apiRefusal:        "whose sessions are created by the MCP client and server only",
	apiView:           true,
	endOnInstanceLoss: true,
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		if mcpSessionless(&req) {
			return e.decideHandle(ctx, st, &req, now)
		}
		id := req.Header("mcp-session-id")
		if id == "" {
			if sseStyle(st, &req) {
				return nil, &Reject{Class: ClassBadRequest, Code: "TransportMismatch",
					Message: fmt.Sprintf("service %q uses MCP Streamable HTTP affinity; HTTP+SSE requests (GET %s, or a session query parameter) are not supported: the two session mechanisms are incompatible",
						st.svc.Name, st.svc.SSE.Path)}
			}
			// An initialize: placed like a new session, its slot provisional until the
			// response names the session.
			d, rej := e.openProvisional(ctx, st, req.Peer, true, now)
			if rej != nil {
				return nil, rej
			}
			d.h = mcpInit{}
			return d, nil
		}
		d, err := e.routeMCP(ctx, st, id, isStream(&req), now)
		if err != nil {
			return nil, err
		}
		if req.Method == "DELETE" {
			d.h = mcpDelete{}
		}
		return d, nil
	},
}

// mcpInit: an initialize's response binds its Mcp-Session-Id to the instance that served it;
// without one (or if the exchange ends first) the provisional slot is freed. A handle mint
// (mcp_handle.go) is the same exchange with the service's learn header and the handle kind.
type mcpInit struct {
	plainExchange
	// header is the lower-case response header naming the new session ("" means
	// mcp-session-id); kind its session kind ("" means KindMCPStreamable).
	header string
	kind   session.Kind
}

func (x mcpInit) respond(d *decision, resp Response) []HeaderValue {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.provisional {
		return nil
	}
	header, kind := cmp.Or(x.header, "mcp-session-id"), cmp.Or(x.kind, session.KindMCPStreamable)
	id := resp.Header(header)
	if id == "" || resp.Status/100 != 2 {
		d.releaseProvisionalLocked()
		return nil
	}
	if !validMCPID(id) {
		d.e.log.Warn("affinity: ignoring an invalid Mcp-Session-Id from upstream", "service", d.st.svc.Name, "instance", d.st.ids[d.idx])
		d.releaseProvisionalLocked()
		return nil
	}
	if i, ok := d.servedIndex(resp); ok && i != d.provIdx {
		d.moveProvisionalLocked(i)
	}
	if kind == session.KindMCPHandle && !d.st.placeable[d.provIdx] {
		// Draining (or standby) instances take no new handle sessions: the client's first use
		// of this handle is a 404, the signal to mint again.
		d.releaseProvisionalLocked()
		return nil
	}
	// The session owns the slot from now on; SessionEnded frees it.
	if err := d.bindProvisionalLocked(context.Background(), d.e.newRecord(d.st, id, d.provIdx, kind, d.e.now())); err != nil {
		d.e.log.Error("affinity: binding an MCP session", "service", d.st.svc.Name, "session", id, "err", err)
		d.releaseProvisionalLocked()
	}
	return nil
}

func (mcpInit) end(d *decision) {
	d.releaseProvisional()
}

// mcpDelete: a 2xx (or 404: the server forgot it already) ends the session; 405 keeps it.
type mcpDelete struct{ plainExchange }

func (mcpDelete) respond(d *decision, resp Response) []HeaderValue {
	if resp.Status/100 == 2 || resp.Status == 404 {
		d.e.terminate(context.Background(), d.st.svc.Name, d.sessionID, "MCP DELETE", d)
	}
	return nil
}
