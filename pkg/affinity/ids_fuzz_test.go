package affinity_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// FuzzClientIDs hands the engine arbitrary Cookie, session-header and Mcp-Session-Id values
// on each affinity mode: a request is either rejected with a class or decided; a client never
// picks its instance — an id the engine did not issue never routes to an existing session —
// and once every decision has ended no request slot is in flight.
func FuzzClientIDs(f *testing.F) {
	f.Add("tether-session=0123456789abcdef0123456789abcdef", "client-chosen", "mcp-1", uint8(0))
	f.Add("a=b; tether-session=\"quoted\"; c", "", "\x00", uint8(1))
	f.Add(";;=;tether-session=;", "-bad", strings.Repeat("x", 300), uint8(2))
	f.Add("tether-session=%00", "ok_1", "id with space", uint8(3))
	modes := []registry.AffinityMode{registry.AffinityCookie, registry.AffinityHeader,
		registry.AffinityMCPStreamable, registry.AffinityMCPSSE}
	var svcs []registry.Service
	var insts []registry.Instance
	for i, m := range modes {
		name := "s-" + string(m)
		svc := affinitytest.Service(name, m)
		svc.Match.PathPrefix = "/" + string(rune('a'+i))
		svcs = append(svcs, svc)
		insts = append(insts, affinitytest.Instances(name, 2)...)
	}
	fx := affinitytest.New(f, svcs, insts)
	ctx := context.Background()
	// One real session per service, so that fuzzed ids may collide with an issued one.
	issued := map[string]string{}
	for _, s := range svcs {
		d, err := fx.Engine.Decide(ctx, affinity.Request{Service: s.Name, Protocol: affinity.ProtocolHTTP, Method: "POST",
			Path: s.Match.PathPrefix, Headers: map[string][]string{"content-type": {"application/json"}}})
		if err == nil {
			issued[s.Name] = d.SessionID()
			d.End()
		}
	}
	f.Fuzz(func(t *testing.T, cookie, header, mcp string, mode uint8) {
		s := svcs[int(mode)%len(svcs)]
		req := affinity.Request{Service: s.Name, Protocol: affinity.ProtocolHTTP, Method: "POST", Path: s.Match.PathPrefix + "?sessionId=" + mcp,
			Headers: map[string][]string{"cookie": {cookie}, s.HeaderField: {header}, "mcp-session-id": {mcp}, "accept": {"text/event-stream"}}}
		d, err := fx.Engine.Decide(ctx, req)
		if err != nil {
			var rej *affinity.Reject
			if !errors.As(err, &rej) {
				t.Fatalf("Decide: %v is neither a decision nor a rejection", err)
			}
		} else {
			if id := d.SessionID(); id != "" && !d.NewSession() && id != issued[s.Name] && !strings.Contains(cookie+header+mcp, id) {
				t.Fatalf("routed to session %q that neither the engine issued nor the client named", id)
			}
			d.End()
		}
		for _, sv := range svcs {
			for inst, u := range fx.Usage(t, sv.Name) {
				if u[1] != 0 {
					t.Fatalf("%d requests in flight on %s/%s after every decision ended", u[1], sv.Name, inst)
				}
			}
		}
	})
}

// FuzzCookieHeader checks the Cookie header parser through the engine's view of a request:
// the session a cookie names is found whatever surrounds it.
func FuzzCookieHeader(f *testing.F) {
	f.Add("a=b", "c=d")
	f.Add("", " ;")
	f.Add("x=\"y", "tether-session")
	svc := affinitytest.Service("web", registry.AffinityCookie)
	fx := affinitytest.New(f, []registry.Service{svc}, affinitytest.Instances("web", 3))
	ctx := context.Background()
	d, err := fx.Engine.Decide(ctx, affinity.Request{Service: "web", Protocol: affinity.ProtocolHTTP, Method: "GET", Path: "/"})
	if err != nil {
		f.Fatal(err)
	}
	id, inst := d.SessionID(), d.Instance().ID
	d.End()
	f.Fuzz(func(t *testing.T, before, after string) {
		if strings.Contains(before, svc.Cookie.Name) {
			return // an earlier cookie of the same name rightly wins
		}
		// Only cookie-pairs before ours, separated by "; " as RFC 6265 §4.2.1 writes them.
		line := strings.Trim(strings.ReplaceAll(before, ";", ""), " ") + "; " + svc.Cookie.Name + "=" + id + "; " + after
		d, err := fx.Engine.Decide(ctx, affinity.Request{Service: "web", Protocol: affinity.ProtocolHTTP, Method: "GET", Path: "/",
			Headers: map[string][]string{"cookie": {line}}})
		if err != nil {
			t.Fatalf("Decide(%q): %v", line, err)
		}
		defer d.End()
		if d.SessionID() != id || d.Instance().ID != inst || d.NewSession() {
			t.Fatalf("cookie line %q: session %q on %s (new %v), want %q on %s", line, d.SessionID(), d.Instance().ID, d.NewSession(), id, inst)
		}
	})
}
