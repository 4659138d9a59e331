package affinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// mcpSSEMode is MCP HTTP+SSE affinity (2024-11-05): the GET to service.SSE.Path is placed with
// a provisional session slot; the session id its first endpoint event announces
// (LearnSession) binds the session, which ends with the GET's stream; requests naming the id in
// service.SSE.SessionParam go to its instance, else 404. HTTP only; no SessionAPI; sessions of
// a lost instance end.
var mcpSSEMode = mode{
	affinity:          registry.AffinityMCPSSE,
	name:              "mcp-sse",
	http:              true,
	apiRefusal:        "whose sessions are created by the MCP client and server only",
	apiView:           true,
	endOnInstanceLoss: true,
	decide: func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error) {
		path, query := splitPath(req.Path)
		if req.Method == "GET" && path == st.svc.SSE.Path {
			if query != "" {
				return nil, &Reject{Class: ClassBadRequest, Code: "InvalidArgument",
					Message: "the first SSE request may not carry query parameters"}
			}
			// The GET is a stream: it holds a stream slot when the service counts them.
			d, rej := e.openProvisional(ctx, st, req.Peer, st.streams == nil, now)
			if rej != nil {
				return nil, rej
			}
			d.h = sseGet{}
			if st.streams != nil {
				if d.ticket, rej = e.admitFor(ctx, st, d.provIdx, true); rej != nil {
					d.releaseProvisional()
					return nil, rej
				}
			}
			d.stream.Store(true) // the GET is the SSE stream
			return d, nil
		}
		if id, ok := queryParam(query, st.svc.SSE.SessionParam); ok {
			return e.routeMCP(ctx, st, id, false, now)
		}
		return e.freeDecision(ctx, st, &req, now)
	},
}

// sseGet is the SSE GET stream: its body's endpoint event announces the session, which lives
// as long as the stream.
type sseGet struct{}

// respond moves the provisional slot to the instance that really served the stream.
func (sseGet) respond(d *decision, resp Response) []HeaderValue {
	if i, ok := d.servedIndex(resp); ok {
		d.mu.Lock()
		if i != d.provIdx {
			d.moveProvisionalLocked(i)
		}
		d.mu.Unlock()
	}
	return nil
}

func (sseGet) wantsBody() bool { return true }

func (sseGet) learn(d *decision, id string) error {
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
	if err := d.bindProvisionalLocked(context.Background(), d.e.newRecord(d.st, id, d.provIdx, session.KindMCPSSE, d.e.now())); err != nil {
		return fmt.Errorf("affinity: binding SSE session %q: %w", id, err)
	}
	d.learned = id
	return nil
}

// end frees a provisional slot, or ends the session the stream carried.
func (sseGet) end(d *decision) {
	d.mu.Lock()
	d.releaseProvisionalLocked()
	learned := d.learned
	d.mu.Unlock()
	if learned == "" || d.handedOff.Load() { // a handed-off stream goes on: so does its session
		return
	}
	if _, err := d.e.store.End(context.Background(), d.st.svc.Name, learned, session.StatusTerminated, d.e.now()); err != nil &&
		!errors.Is(err, session.ErrEnded) && !errors.Is(err, session.ErrNotFound) {
		d.e.log.Error("affinity: ending an SSE session", "service", d.st.svc.Name, "session", learned, "err", err)
	}
}

// touchID keeps the learned session fresh while the stream is open.
func (sseGet) touchID(d *decision) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.learned
}
