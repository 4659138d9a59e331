package affinity

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// mode is one affinity mode's descriptor: everything the engine, the SessionAPI and config
// validation need to know about it lives in the mode's own file (mode_*.go) as one value of
// this type, listed once in modes. A new mode is one new file, one line in modes, its
// registry.AffinityMode constant and its proto enum value.
type mode struct {
	// affinity (and balancing, when set) select the mode for a service: the first entry of
	// modes that matches wins.
	affinity  registry.AffinityMode
	balancing registry.Balancing
	// name is how logs and errors call the mode.
	name string
	// http and sip say which protocols the mode serves. A request of another protocol is
	// refused (ClassBadRequest, ProtocolNotSupported) before anything is placed or stored.
	http, sip bool
	// api is how the SessionAPI manages the mode's sessions; nil: it does not, and apiRefusal
	// says why.
	api        *apiSupport
	apiRefusal string
	// apiView: without api, the SessionAPI still lists, reads and deletes the mode's sessions
	// (it does not create or change them).
	apiView bool
	// ring: the mode looks keys up on the service's Maglev table.
	ring bool
	// dcr: the mode reads the service's DCR file.
	dcr bool
	// endOnInstanceLoss: the sessions of an instance that stops being routable are ended (their
	// clients must start over) rather than rebound on their next request.
	endOnInstanceLoss bool
	// decide admits one request of the mode (req is a copy: the Request stays on the stack).
	decide func(ctx context.Context, e *Engine, st *svcState, req Request, now time.Time) (*decision, error)
}

// apiSupport is how the SessionAPI creates a mode's sessions.
type apiSupport struct {
	kind session.Kind
	// customIDs: CreateSession may name the id (else ids are always generated).
	customIDs bool
}

// modes lists every mode descriptor; modeFor takes the first that matches a service.
var modes = [...]*mode{
	&stickyMode, // before noneMode: none with balancing sticky-round-robin
	&noneMode,
	&cookieMode,
	&headerMode,
	&mcpStreamableMode,
	&mcpSSEMode,
	&hashMode,
}

// modeFor returns the descriptor of a normalized service's mode.
func modeFor(svc registry.Service) *mode {
	for _, m := range modes {
		if m.affinity == svc.Affinity && (m.balancing == "" || m.balancing == svc.Balancing) {
			return m
		}
	}
	return &noneMode
}

// Affinities lists the affinity modes a service may name (registry.AffinityMode values), in
// the order of modes: what config validation accepts.
func Affinities() []string {
	var out []string
	for _, m := range modes {
		if !slices.Contains(out, string(m.affinity)) {
			out = append(out, string(m.affinity))
		}
	}
	return out
}

// serves reports whether the mode serves protocol p.
func (m *mode) serves(p Protocol) bool {
	switch p {
	case ProtocolSIP:
		return m.sip
	case ProtocolHTTP, "":
		return m.http
	}
	return false
}

// Serves reports whether a service's affinity mode can serve protocol p: HTTP for every mode,
// SIP for none (balanced among the instances with a SIP port) and hash only. Config
// validation refuses SIP ports on services whose mode does not serve SIP.
func Serves(svc registry.Service, p Protocol) bool { return modeFor(normalized(svc)).serves(p) }

// ModeName names a service's effective affinity mode (e.g. "sticky-round-robin" for affinity
// none with balancing sticky-round-robin).
func ModeName(svc registry.Service) string { return modeFor(normalized(svc)).name }

// Decide routes one request or refuses it with a *Reject. An admitted HTTP request holds a
// request slot until the Decision's End. Any other error is an internal failure.
func (e *Engine) Decide(ctx context.Context, req Request) (Decision, error) {
	v := e.view.Load()
	st, rej := v.resolve(&req)
	if rej != nil {
		return nil, rej
	}
	if req.GRPCRing {
		// Before the subset: the pinned copies it caches are of the view's own state.
		st = st.pinnedToGRPCPick(&req)
	}
	if len(req.Subset) > 0 {
		if st, rej = st.restricted(req.Subset); rej != nil {
			return nil, rej
		}
	}
	if !st.mode.serves(req.Protocol) {
		return nil, &Reject{Class: ClassBadRequest, Code: "ProtocolNotSupported",
			Message: fmt.Sprintf("service %q uses %s affinity, which does not serve %s requests", st.svc.Name, st.mode.name, protocolName(req.Protocol))}
	}
	d, err := st.mode.decide(ctx, e, st, req, e.now())
	if err != nil {
		return nil, err
	}
	if d.ticket != nil {
		e.open.add(d) // from here on the sweeper and MCP DELETEs may End it
	}
	return d, nil
}

func protocolName(p Protocol) string {
	if p == "" {
		return string(ProtocolHTTP)
	}
	return string(p)
}
