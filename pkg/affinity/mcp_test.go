package affinity_test

import (
	"context"
	"encoding/base64"
	"errors"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

func mcpReq(method, sid string, headers ...string) affinity.Request {
	h := append([]string{}, headers...)
	if sid != "" {
		h = append(h, "mcp-session-id", sid)
	}
	return affinitytest.HTTP("mcp", method, "/mcp", h...)
}

// initMCP runs an initialize exchange whose response assigns sid; the exchange is ended.
func initMCP(t *testing.T, f *affinitytest.Fixture, sid string) string {
	t.Helper()
	d := mustDecide(t, f, mcpReq("POST", ""))
	defer d.End()
	if d.SessionID() != "" || !d.NewSession() {
		t.Fatalf("initialize: SessionID %q new %v", d.SessionID(), d.NewSession())
	}
	if hv := d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"mcp-session-id": {sid}}}); len(hv) != 0 {
		t.Errorf("initialize response adds %v", hv)
	}
	return d.Instance().ID
}

func TestMCPStreamable(t *testing.T) {
	newFixture := func(t *testing.T, perInstance, n int) *affinitytest.Fixture {
		svc := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
		svc.SessionsPerInstance = perInstance
		return affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("mcp", n))
	}

	t.Run("learn and route", func(t *testing.T) {
		f := newFixture(t, 20, 3)
		inst := initMCP(t, f, "SESSION-A")
		s, err := f.Store.Get(context.Background(), "mcp", "SESSION-A")
		if err != nil || s.Instance != inst || s.Kind != session.KindMCPStreamable {
			t.Fatalf("learned session %+v, %v; want kind mcp-streamable on %s", s, err, inst)
		}
		for _, m := range []string{"POST", "GET", "POST"} {
			d := mustDecide(t, f, mcpReq(m, "SESSION-A", "mcp-protocol-version", "2025-06-18", "last-event-id", "1"))
			if d.Instance().ID != inst || d.SessionID() != "SESSION-A" {
				t.Errorf("%s went to %s, want %s", m, d.Instance().ID, inst)
			}
			d.End()
		}
		if u := f.Usage(t, "mcp")[inst]; u != [2]int{1, 0} {
			t.Errorf("usage %v, want 1 session and no request", u)
		}
	})
	t.Run("no session id in the response frees the provisional slot", func(t *testing.T) {
		f := newFixture(t, 1, 1)
		d := mustDecide(t, f, mcpReq("POST", ""))
		if u := f.Usage(t, "mcp")["i1"]; u != [2]int{1, 1} {
			t.Fatalf("usage while initializing %v, want a provisional session and a request", u)
		}
		mustReject(t, f, mcpReq("POST", ""), affinity.ClassNoCapacity)
		d.OnResponse(affinity.Response{Status: 200})
		d.End()
		if u := f.Usage(t, "mcp")["i1"]; u != [2]int{0, 0} {
			t.Fatalf("usage after a sessionless response %v, want none", u)
		}
		// An exchange ended without a response frees it too.
		d = mustDecide(t, f, mcpReq("POST", ""))
		d.End()
		if u := f.Usage(t, "mcp")["i1"]; u != [2]int{0, 0} {
			t.Fatalf("usage after an aborted initialize %v, want none", u)
		}
	})
	t.Run("unknown and ended ids are 404", func(t *testing.T) {
		f := newFixture(t, 20, 2)
		rej := rejection(t, f, mcpReq("POST", "NOPE"), affinity.ClassNotFound)
		if rej.Code != "SessionNotFound" {
			t.Errorf("code %q", rej.Code)
		}
		mustReject(t, f, mcpReq("POST", "bad id\x01"), affinity.ClassNotFound)
		initMCP(t, f, "S1")
		if _, err := f.Store.End(context.Background(), "mcp", "S1", session.StatusExpired, f.Clock.Now()); err != nil {
			t.Fatal(err)
		}
		mustReject(t, f, mcpReq("GET", "S1"), affinity.ClassNotFound)
	})
	t.Run("DELETE ends the session, its slot and its streams", func(t *testing.T) {
		f := newFixture(t, 1, 1)
		initMCP(t, f, "S1")
		stream := mustDecide(t, f, mcpReq("GET", "S1")) // standalone SSE stream, left open
		mustReject(t, f, mcpReq("POST", ""), affinity.ClassNoCapacity)
		del := mustDecide(t, f, mcpReq("DELETE", "S1"))
		if u := f.Usage(t, "mcp")["i1"]; u != [2]int{1, 2} {
			t.Fatalf("usage before the DELETE answer %v", u)
		}
		del.OnResponse(affinity.Response{Status: 204})
		if u := f.Usage(t, "mcp")["i1"]; u != [2]int{0, 1} {
			t.Fatalf("usage after DELETE 204 %v, want no session and only the DELETE in flight", u)
		}
		del.End()
		stream.End() // already released: no double release
		if u := f.Usage(t, "mcp")["i1"]; u != [2]int{0, 0} {
			t.Fatalf("usage after all ends %v", u)
		}
		s, err := f.Store.Get(context.Background(), "mcp", "S1")
		if err != nil || s.Status != session.StatusTerminated {
			t.Fatalf("record %+v, %v; want Terminated", s, err)
		}
		mustReject(t, f, mcpReq("POST", "S1"), affinity.ClassNotFound)
		// One session per instance: a new session is accepted right after.
		initMCP(t, f, "S2")
	})
	t.Run("DELETE refused by the server keeps the session", func(t *testing.T) {
		f := newFixture(t, 20, 1)
		initMCP(t, f, "S1")
		del := mustDecide(t, f, mcpReq("DELETE", "S1"))
		del.OnResponse(affinity.Response{Status: 405})
		del.End()
		mustDecide(t, f, mcpReq("POST", "S1")).End()
	})
	t.Run("sessionless protocol versions are balanced freely", func(t *testing.T) {
		f := newFixture(t, 1, 2)
		seen := map[string]int{}
		for _, h := range [][]string{
			{"mcp-protocol-version", "2026-07-28"},
			{"mcp-protocol-version", "2027-01-01"},
			{"mcp-method", "server/discover"},
			{"mcp-protocol-version", "2026-07-28", "mcp-session-id", "IGNORED"},
		} {
			for range 2 {
				d := mustDecide(t, f, mcpReq("POST", "", h...))
				seen[d.Instance().ID]++
				if hv := d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"mcp-session-id": {"X"}}}); len(hv) != 0 {
					t.Errorf("sessionless response adds %v", hv)
				}
				d.End()
			}
		}
		if seen["i1"] != 4 || seen["i2"] != 4 {
			t.Errorf("sessionless requests per instance %v, want round robin 4/4", seen)
		}
		if _, err := f.Store.Get(context.Background(), "mcp", "X"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("a sessionless exchange learned a session: %v", err)
		}
		if u := f.Usage(t, "mcp"); u["i1"][0]+u["i2"][0] != 0 {
			t.Errorf("sessionless exchanges hold session slots: %v", u)
		}
		// 2025 versions still get affinity.
		d := mustDecide(t, f, mcpReq("POST", "", "mcp-protocol-version", "2025-11-25"))
		if !d.NewSession() {
			t.Error("a 2025-11-25 request without a session id is not placed as a new session")
		}
		d.End()
	})
	t.Run("HTTP+SSE traffic is refused", func(t *testing.T) {
		f := newFixture(t, 20, 1)
		for _, r := range []affinity.Request{
			affinitytest.HTTP("mcp", "GET", "/sse"),
			affinitytest.HTTP("mcp", "POST", "/messages?sessionId=abc"),
			affinitytest.HTTP("mcp", "POST", "/sse?sessionid=abc"),
		} {
			rej := rejection(t, f, r, affinity.ClassBadRequest)
			if rej.Code != "TransportMismatch" {
				t.Errorf("%s %s: code %q", r.Method, r.Path, rej.Code)
			}
		}
	})
	t.Run("instance loss ends its sessions", func(t *testing.T) {
		f := newFixture(t, 20, 2)
		inst := initMCP(t, f, "S1")
		stream := mustDecide(t, f, mcpReq("GET", "S1"))
		defer stream.End()
		setHealth(t, f, "mcp", inst, registry.HealthUnhealthy)
		testutil.Eventually(t, "the session to end", func() bool {
			s, err := f.Store.Get(context.Background(), "mcp", "S1")
			return err == nil && s.Status == session.StatusTerminated
		})
		// The engine ends the record first and then the session's open exchanges (the GET
		// stream), so the stream slot is released just after the record reads Terminated.
		var u [2]int
		if !testutil.Poll(testutil.DefaultWait, func() bool { u = f.Usage(t, "mcp")[inst]; return u == [2]int{0, 0} }) {
			t.Errorf("lost instance usage %v, want its session and stream released", u)
		}
		rej := rejection(t, f, mcpReq("POST", "S1"), affinity.ClassNotFound)
		if rej.RetryAfter != 0 {
			t.Errorf("404 with RetryAfter %v", rej.RetryAfter)
		}
		// The client re-initialises onto the live instance.
		if got := initMCP(t, f, "S2"); got == inst {
			t.Errorf("re-initialised onto the unhealthy instance %s", got)
		}
	})
	t.Run("instance loss is detected on the request path too", func(t *testing.T) {
		svc := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
		f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("mcp", 2), affinitytest.WithoutRun())
		inst := initMCP(t, f, "S1")
		if err := f.Registry.Deregister(registry.Key{Service: "mcp", ID: inst}); err != nil {
			t.Fatal(err)
		}
		f.Sync(t)
		mustReject(t, f, mcpReq("POST", "S1"), affinity.ClassNotFound)
		s, err := f.Store.Get(context.Background(), "mcp", "S1")
		if err != nil || s.Status != session.StatusTerminated {
			t.Errorf("record %+v, %v; want Terminated", s, err)
		}
	})
}

func TestMCPSSE(t *testing.T) {
	newFixture := func(t *testing.T) *affinitytest.Fixture {
		svc := affinitytest.Service("sse", registry.AffinityMCPSSE)
		svc.SessionsPerInstance = 1
		return affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("sse", 2))
	}
	t.Run("first request with a query is refused", func(t *testing.T) {
		f := newFixture(t)
		rej := rejection(t, f, affinitytest.HTTP("sse", "GET", "/sse?x=1"), affinity.ClassBadRequest)
		if rej.Message != "the first SSE request may not carry query parameters" {
			t.Errorf("message %q", rej.Message)
		}
	})
	t.Run("learn, route, end", func(t *testing.T) {
		f := newFixture(t)
		get := mustDecide(t, f, affinitytest.HTTP("sse", "GET", "/sse", "accept", "text/event-stream"))
		if !get.WantsResponseBody() {
			t.Fatal("the SSE GET does not ask for its response body")
		}
		inst := get.Instance().ID
		get.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"content-type": {"text/event-stream"}}})
		if err := get.LearnSession("3f2a-uuid"); err != nil {
			t.Fatal(err)
		}
		if err := get.LearnSession("other"); err == nil {
			t.Error("a second LearnSession succeeded")
		}
		for range 3 {
			d := mustDecide(t, f, affinitytest.HTTP("sse", "POST", "/messages?sessionId=3f2a-uuid"))
			if d.Instance().ID != inst || d.WantsResponseBody() {
				t.Errorf("POST went to %s (wants body %v), want %s", d.Instance().ID, d.WantsResponseBody(), inst)
			}
			d.End()
		}
		mustReject(t, f, affinitytest.HTTP("sse", "POST", "/messages?sessionId=unknown"), affinity.ClassNotFound)
		if u := f.Usage(t, "sse")[inst]; u != [2]int{1, 1} {
			t.Errorf("usage with the stream open %v, want 1 session and the stream's request", u)
		}
		get.End()
		if u := f.Usage(t, "sse")[inst]; u != [2]int{0, 0} {
			t.Errorf("usage after the stream ended %v", u)
		}
		mustReject(t, f, affinitytest.HTTP("sse", "POST", "/messages?sessionId=3f2a-uuid"), affinity.ClassNotFound)
		s, err := f.Store.Get(context.Background(), "sse", "3f2a-uuid")
		if err != nil || s.Status != session.StatusTerminated || s.Kind != session.KindMCPSSE {
			t.Errorf("record %+v, %v; want a Terminated mcp-sse session", s, err)
		}
	})
	t.Run("a handed-off stream keeps its session", func(t *testing.T) {
		f := newFixture(t)
		get := mustDecide(t, f, affinitytest.HTTP("sse", "GET", "/sse", "accept", "text/event-stream"))
		inst := get.Instance().ID
		get.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"content-type": {"text/event-stream"}}})
		if err := get.LearnSession("5b1c-uuid"); err != nil {
			t.Fatal(err)
		}
		if err := get.HandOff(context.Background()); err != nil {
			t.Fatalf("HandOff on this process's own counters: %v", err)
		}
		// The request slot goes with this process's counters; the session stays (the stream
		// goes on at the instance without tether), and its POSTs still route there.
		if u := f.Usage(t, "sse")[inst]; u != [2]int{1, 0} {
			t.Errorf("usage after the handoff %v, want the session and no request", u)
		}
		d := mustDecide(t, f, affinitytest.HTTP("sse", "POST", "/messages?sessionId=5b1c-uuid"))
		if d.Instance().ID != inst {
			t.Errorf("POST after the handoff went to %s, want %s", d.Instance().ID, inst)
		}
		d.End()
		get.End() // after HandOff: nothing more
		if err := get.HandOff(context.Background()); err == nil {
			t.Error("a second HandOff succeeded")
		}
		if s, err := f.Store.Get(context.Background(), "sse", "5b1c-uuid"); err != nil || s.Status != session.StatusActive {
			t.Errorf("record %+v, %v; want the session still active", s, err)
		}
	})
	t.Run("a stream that never announces frees its slot", func(t *testing.T) {
		f := newFixture(t)
		get := mustDecide(t, f, affinitytest.HTTP("sse", "GET", "/sse"))
		get.OnResponse(affinity.Response{Status: 500})
		get.End()
		if err := get.LearnSession("late"); err == nil {
			t.Error("LearnSession after End succeeded")
		}
		if u := f.Usage(t, "sse")[get.Instance().ID]; u != [2]int{0, 0} {
			t.Errorf("usage %v", u)
		}
	})
	t.Run("other requests are balanced", func(t *testing.T) {
		f := newFixture(t)
		d := mustDecide(t, f, affinitytest.HTTP("sse", "GET", "/healthz"))
		if d.NewSession() || d.SessionID() != "" {
			t.Errorf("plain request: new %v id %q", d.NewSession(), d.SessionID())
		}
		d.End()
	})
	t.Run("only the SSE GET learns", func(t *testing.T) {
		f := newFixture(t)
		d := mustDecide(t, f, affinitytest.HTTP("sse", "GET", "/healthz"))
		defer d.End()
		if err := d.LearnSession("x"); !errors.Is(err, affinity.ErrUnsupported) {
			t.Errorf("LearnSession on a plain request: %v", err)
		}
	})
}

func TestMCPHandleParamEncoding(t *testing.T) {
	svc := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	svc.MCPHandle = registry.MCPHandle{Header: "Handle", LearnHeader: "Mcp-Handle", MintTools: []string{"open"}}
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("mcp", 3))
	call := func(tool string, headers ...string) affinity.Request {
		return mcpReq("POST", "", append([]string{"mcp-protocol-version", "2026-07-28", "mcp-method", "tools/call", "mcp-name", tool}, headers...)...)
	}
	// The server mints a handle that looks like the encoded form, so a client must encode it.
	const handle = "=?base64?not-really?="
	d := mustDecide(t, f, call("open"))
	minted := d.Instance().ID
	d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"mcp-handle": {handle}}})
	d.End()
	if s, err := f.Store.Get(context.Background(), "mcp", handle); err != nil || s.Instance != minted || s.Kind != session.KindMCPHandle {
		t.Fatalf("minted handle bound as %+v, %v; want an mcp-handle session on %s", s, err, minted)
	}

	encoded := "=?base64?" + base64.StdEncoding.EncodeToString([]byte(handle)) + "?="
	for range 5 {
		d := mustDecide(t, f, call("use", "mcp-param-handle", encoded))
		if d.Instance().ID != minted {
			t.Fatalf("encoded handle went to %s, want %s", d.Instance().ID, minted)
		}
		d.End()
	}
	mustReject(t, f, call("use", "mcp-param-handle", "=?base64?%%%?="), affinity.ClassNotFound)
	mustReject(t, f, call("use", "mcp-param-handle", "=?base64?"+base64.StdEncoding.EncodeToString([]byte("never-minted"))+"?="), affinity.ClassNotFound)
}
