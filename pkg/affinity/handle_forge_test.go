package affinity_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// TestForgedMCPHandles is #25 finding 3: on the landed build a client writing
// "Mcp-Param-Handle: <instance-prefix>:<random>" created a full session per request — 50 in a
// row, on a draining instance, past every per-client limit — that the SessionAPI could neither
// list nor delete. Now an unknown handle binds only by taking a mint credit the same client
// earned on that instance with a real mint; forged ones are 404 HandleNotFound and create
// nothing, a draining instance takes no new handle, every handle session is listed and
// deletable, and a deleted handle is unknown again.
func TestForgedMCPHandles(t *testing.T) {
	svc := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	svc.MCPHandle = registry.MCPHandle{Header: "Handle", InstancePrefix: true, PrefixSeparator: ":", MintTools: []string{"open"}}
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("mcp", 3),
		affinitytest.WithEngineOptions(affinity.WithNewSessionLimit(anonymousLimits)))
	ctx := context.Background()
	if err := f.Registry.SetState(registry.Key{Service: "mcp", ID: "i1"}, registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	call := func(peer, tool string, headers ...string) affinity.Request {
		r := mcpReq("POST", "", append([]string{"mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call", "mcp-name", tool}, headers...)...)
		r.Peer = peer
		return r
	}
	sessions := func() int {
		n := 0
		for _, u := range f.Usage(t, "mcp") {
			n += u[0]
		}
		return n
	}
	const attacker, victim = "203.0.113.66:4000", "198.51.100.20:5000"

	// 50 forged handles on the draining i1 and on the active i2: none routes, nothing is held.
	for i := range 50 {
		for _, inst := range []string{"i1", "i2"} {
			rej := rejection(t, f, call(attacker, "use", "mcp-param-handle", fmt.Sprintf("%s:forged-%d", inst, i)), affinity.ClassNotFound)
			if rej.Code != "HandleNotFound" {
				t.Fatalf("forged handle on %s: code %s, want HandleNotFound", inst, rej.Code)
			}
		}
	}
	if n := sessions(); n != 0 {
		t.Fatalf("forged handles hold %d sessions, want 0", n)
	}

	// A real mint by the victim: its first use binds (on the minting instance), the attacker
	// cannot spend the victim's credit, and a second forged handle on the same instance fails.
	d := mustDecide(t, f, call(victim, "open"))
	minted := d.Instance().ID
	if minted == "i1" {
		t.Fatal("a mint was placed on the draining instance")
	}
	d.OnResponse(affinity.Response{Status: 200})
	d.End()
	handle := minted + ":real-handle"
	mustReject(t, f, call(attacker, "use", "mcp-param-handle", handle), affinity.ClassNotFound)
	for range 3 {
		d := mustDecide(t, f, call(victim, "use", "mcp-param-handle", handle))
		if d.Instance().ID != minted {
			t.Fatalf("the minted handle went to %s, want %s", d.Instance().ID, minted)
		}
		d.End()
	}
	mustReject(t, f, call(victim, "use", "mcp-param-handle", minted+":second-forged"), affinity.ClassNotFound)
	if n := sessions(); n != 1 {
		t.Fatalf("%d sessions held, want the one minted handle", n)
	}

	// Visible and deletable through the SessionAPI; deleted, it is unknown again.
	list, _, err := f.Engine.ListSessions(ctx, session.Filter{Service: "mcp"}, "", 10)
	if err != nil || len(list) != 1 || list[0].ID != handle || list[0].Kind != session.KindMCPHandle {
		t.Fatalf("ListSessions = %+v, %v; want the handle session", list, err)
	}
	if s, err := f.Engine.GetSession(ctx, "mcp", handle); err != nil || s.Instance != minted {
		t.Fatalf("GetSession = %+v, %v", s, err)
	}
	if err := f.Engine.DeleteSession(ctx, "mcp", handle); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	f.Sync(t)
	mustReject(t, f, call(victim, "use", "mcp-param-handle", handle), affinity.ClassNotFound)
	if n := sessions(); n != 0 {
		t.Errorf("%d sessions held after the delete, want 0", n)
	}

	// Handle mints count under the client's ceiling: the attacker minting on and on holds at
	// most its ceiling of 40 credits and handle sessions.
	bound := 0
	for i := range 60 {
		d, err := f.Engine.Decide(ctx, call(fmt.Sprintf("203.0.113.66:%d", 6000+i), "open"))
		if err != nil {
			continue
		}
		inst := d.Instance().ID
		d.OnResponse(affinity.Response{Status: 200})
		d.End()
		if d, err := f.Engine.Decide(ctx, call(attacker, "use", "mcp-param-handle", fmt.Sprintf("%s:h%d", inst, i))); err == nil {
			d.End()
			bound++
		}
		f.Clock.Advance(time.Second)
	}
	if bound > 40 || sessions() > 40 {
		t.Errorf("one client bound %d handles (%d held), want ≤ 40 (its ceiling)", bound, sessions())
	}
}

// TestLearnedHandleNotBoundOnDrainingInstance: a mint whose response the data plane served from
// a draining instance (an Envoy fallback) binds no handle there.
func TestLearnedHandleNotBoundOnDrainingInstance(t *testing.T) {
	svc := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	svc.MCPHandle = registry.MCPHandle{Header: "Handle", LearnHeader: "Mcp-Handle", MintTools: []string{"open"}}
	insts := affinitytest.Instances("mcp", 2)
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	if err := f.Registry.SetState(registry.Key{Service: "mcp", ID: "i1"}, registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	d := mustDecide(t, f, mcpReq("POST", "", "mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call", "mcp-name", "open"))
	d.OnResponse(affinity.Response{Status: 200, ServedHost: insts[0].HTTPAddr(), Headers: map[string][]string{"mcp-handle": {"h-on-draining"}}})
	d.End()
	if s, err := f.Store.Get(context.Background(), "mcp", "h-on-draining"); err == nil {
		t.Fatalf("handle bound on %s (%+v), want none on the draining instance", s.Instance, s)
	}
}
