package affinity_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/dcr/dcrtest"
	"github.com/tether-dev/tether/pkg/registry"
)

func TestNoAffinityBalancing(t *testing.T) {
	t.Run("round robin skips draining and full instances", func(t *testing.T) {
		svc := affinitytest.Service("web", registry.AffinityNone)
		svc.RequestSlotsPerInstance = 2
		insts := affinitytest.Instances("web", 4)
		insts[3].State = registry.StateDraining
		f := affinitytest.New(t, []registry.Service{svc}, insts)
		seen := map[string]int{}
		var open []affinity.Decision
		for range 6 {
			d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
			seen[d.Instance().ID]++
			if d.NewSession() || d.SessionID() != "" || len(d.OnResponse(affinity.Response{Status: 200})) != 0 {
				t.Errorf("a request without affinity has session state")
			}
			open = append(open, d)
		}
		if diff := cmp.Diff(map[string]int{"i1": 2, "i2": 2, "i3": 2}, seen); diff != "" {
			t.Errorf("spread (-want +got):\n%s", diff)
		}
		rej := rejection(t, f, affinitytest.HTTP("web", "GET", "/"), affinity.ClassTooManyRequests)
		if rej.RetryAfter == 0 {
			t.Error("429 without RetryAfter")
		}
		for _, d := range open {
			d.End()
		}
		for _, id := range []string{"i1", "i2", "i3"} {
			setHealth(t, f, "web", id, registry.HealthUnhealthy)
		}
		mustReject(t, f, affinitytest.HTTP("web", "GET", "/"), affinity.ClassNoCapacity)
	})
	t.Run("least request", func(t *testing.T) {
		svc := affinitytest.Service("web", registry.AffinityNone)
		svc.Balancing = registry.BalanceLeastRequest
		f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 3))
		var open []affinity.Decision
		for range 9 {
			open = append(open, mustDecide(t, f, affinitytest.HTTP("web", "GET", "/")))
		}
		u := f.Usage(t, "web")
		if u["i1"][1] != 3 || u["i2"][1] != 3 || u["i3"][1] != 3 {
			t.Errorf("in flight %v, want 3 each", u)
		}
		// Free two slots on i2: it is now the least loaded.
		n := 0
		for _, d := range open {
			if d.Instance().ID == "i2" && n < 2 {
				d.End()
				n++
			}
		}
		d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
		if d.Instance().ID != "i2" {
			t.Errorf("least request picked %s, want i2", d.Instance().ID)
		}
		d.End()
		for _, d := range open {
			d.End()
		}
	})
	t.Run("consistent hash on the peer address", func(t *testing.T) {
		svc := affinitytest.Service("web", registry.AffinityNone)
		svc.Balancing = registry.BalanceConsistentHash
		f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 5))
		peers := map[string]bool{}
		for p := range 50 {
			req := affinitytest.HTTP("web", "GET", "/")
			req.Peer = fmt.Sprintf("198.51.100.%d:5000", p)
			first := mustDecide(t, f, req)
			first.End()
			peers[first.Instance().ID] = true
			for range 3 {
				d := mustDecide(t, f, req)
				if d.Instance().ID != first.Instance().ID {
					t.Fatalf("peer %s moved from %s to %s", req.Peer, first.Instance().ID, d.Instance().ID)
				}
				d.End()
			}
		}
		if len(peers) < 4 {
			t.Errorf("50 peers landed on only %d instances", len(peers))
		}
	})
}

func TestStickyRoundRobin(t *testing.T) {
	newFixture := func(t *testing.T, upstreamCookie string) *affinitytest.Fixture {
		svc := affinitytest.Service("web", registry.AffinityNone)
		svc.Balancing = registry.BalanceStickyRoundRobin
		svc.Sticky.UpstreamCookie = upstreamCookie
		svc.Cookie.Name = "tether-sticky"
		return affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 3))
	}
	stickyReq := func(id string) affinity.Request {
		return affinitytest.HTTP("web", "GET", "/", "cookie", "tether-sticky="+id)
	}
	t.Run("spread and stick", func(t *testing.T) {
		f := newFixture(t, "")
		clients := map[string]string{}
		seen := map[string]int{}
		for range 30 {
			d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
			id := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-sticky")
			d.End()
			if id == "" {
				t.Fatal("a new request got no sticky cookie")
			}
			clients[id] = d.Instance().ID
			seen[d.Instance().ID]++
		}
		if diff := cmp.Diff(map[string]int{"i1": 10, "i2": 10, "i3": 10}, seen); diff != "" {
			t.Errorf("spread of new requests (-want +got):\n%s", diff)
		}
		for id, inst := range clients {
			for range 3 {
				d := mustDecide(t, f, stickyReq(id))
				if d.Instance().ID != inst {
					t.Fatalf("sticky client moved from %s to %s", inst, d.Instance().ID)
				}
				if hv := d.OnResponse(affinity.Response{Status: 200}); len(hv) != 0 {
					t.Errorf("a sticky request got %v", hv)
				}
				d.End()
			}
		}
		if u := f.Usage(t, "web"); u["i1"][0]+u["i2"][0]+u["i3"][0] != 0 {
			t.Errorf("sticky sessions hold session slots: %v", u)
		}
	})
	t.Run("only when the upstream sets its cookie", func(t *testing.T) {
		f := newFixture(t, "JSESSIONID")
		d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
		if hv := d.OnResponse(affinity.Response{Status: 200}); len(hv) != 0 {
			t.Errorf("no upstream cookie, yet %v", hv)
		}
		d.End()
		d = mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
		hv := d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"set-cookie": {"JSESSIONID=abc; Path=/"}}})
		d.End()
		if affinitytest.SetCookie(hv, "tether-sticky") == "" {
			t.Errorf("upstream set JSESSIONID, yet %v", hv)
		}
	})
	t.Run("unhealthy instance: rebind and re-issue", func(t *testing.T) {
		f := newFixture(t, "")
		d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
		id := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-sticky")
		from := d.Instance().ID
		d.End()
		setHealth(t, f, "web", from, registry.HealthUnhealthy)
		d = mustDecide(t, f, stickyReq(id))
		to := d.Instance().ID
		if to == from {
			t.Fatalf("routed to unhealthy %s", from)
		}
		if got := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-sticky"); got != id {
			t.Errorf("re-issued cookie %q, want %q", got, id)
		}
		d.End()
		setHealth(t, f, "web", from, registry.HealthHealthy)
		d = mustDecide(t, f, stickyReq(id))
		if d.Instance().ID != to {
			t.Errorf("after the rebind the client went to %s, want %s", d.Instance().ID, to)
		}
		d.End()
	})
	t.Run("unknown or forged cookies are new requests", func(t *testing.T) {
		f := newFixture(t, "")
		for _, v := range []string{"garbage", "00000000000000000000000000000000"} {
			d := mustDecide(t, f, stickyReq(v))
			if c := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-sticky"); c == "" || c == v {
				t.Errorf("cookie %q: new cookie %q", v, c)
			}
			d.End()
		}
	})
}

const testDCR = `<user-centric-rules>
  <sip-rules>
    <header name="X-User" return="request.X-User"><exist/></header>
  </sip-rules>
  <http-rules>
    <header name="X-User" return="request.X-User"><exist/></header>
  </http-rules>
</user-centric-rules>
`

func TestHashAffinity(t *testing.T) {
	newFixture := func(t *testing.T, withDCR bool, n int) *affinitytest.Fixture {
		svc := affinitytest.Service("conv", registry.AffinityHash)
		if withDCR {
			svc.DCRFile = filepath.Join(t.TempDir(), "data-centric-rules.xml")
			if err := os.WriteFile(svc.DCRFile, []byte(testDCR), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("conv", n))
	}
	sipReq := func(user, callID string) affinity.Request {
		r := dcrtest.Request{CallID: callID}
		if user != "" {
			r.Headers = [][2]string{{"X-User", user}}
		}
		return affinity.Request{Service: "conv", Protocol: affinity.ProtocolSIP, Method: "INVITE", SIPMessage: dcrtest.SIP(r)}
	}
	httpReq := func(user string) affinity.Request {
		return affinitytest.HTTP("conv", "POST", "/conf", "x-user", user)
	}

	t.Run("same key, same instance, both protocols", func(t *testing.T) {
		f := newFixture(t, true, 5)
		spread := map[string]int{}
		for u := range 100 {
			user := fmt.Sprintf("user%d", u)
			s := mustDecide(t, f, sipReq(user, fmt.Sprintf("call-%d", u)))
			h := mustDecide(t, f, httpReq(user))
			if s.Instance().ID != h.Instance().ID {
				t.Errorf("%s: SIP on %s, HTTP on %s", user, s.Instance().ID, h.Instance().ID)
			}
			if u := f.Usage(t, "conv")[s.Instance().ID]; u[1] != 1 {
				t.Errorf("SIP decision took a request slot or HTTP did not: %v", u)
			}
			spread[s.Instance().ID]++
			s.End()
			h.End()
		}
		if len(spread) != 5 {
			t.Errorf("100 users spread over %v", spread)
		}
	})
	t.Run("default SIP key: from-tag and call-id", func(t *testing.T) {
		f := newFixture(t, true, 5)
		raw := mustDecide(t, f, sipReq("", "call-x@example.com"))
		// The same call described by headers only.
		hdr := affinity.Request{Service: "conv", Protocol: affinity.ProtocolSIP, Method: "INVITE", Path: "sip:bob@example.com",
			Headers: map[string][]string{"from": {`"Alice" <sip:alice@example.com>;tag=tag-1`}, "to": {"<sip:bob@example.com>"},
				"call-id": {"call-x@example.com"}, "cseq": {"1 INVITE"}, "via": {"SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bK-1"}}}
		d := mustDecide(t, f, hdr)
		if d.Instance().ID != raw.Instance().ID {
			t.Errorf("headers-only SIP on %s, raw on %s", d.Instance().ID, raw.Instance().ID)
		}
		moved := 0
		for c := range 40 {
			d := mustDecide(t, f, sipReq("", fmt.Sprintf("call-%d", c)))
			if d.Instance().ID != raw.Instance().ID {
				moved++
			}
		}
		if moved == 0 {
			t.Error("40 calls all on one instance: the call-id is not part of the key")
		}
		rej := rejection(t, f, affinity.Request{Service: "conv", Protocol: affinity.ProtocolSIP, SIPMessage: []byte("not sip")}, affinity.ClassBadRequest)
		if rej.Code != "InvalidSIPMessage" {
			t.Errorf("code %q", rej.Code)
		}
	})
	t.Run("unhealthy instance: only its keys move, and come back", func(t *testing.T) {
		f := newFixture(t, true, 8)
		owner := func() map[string]string {
			m := map[string]string{}
			for u := range 2000 {
				user := fmt.Sprintf("u%d", u)
				d := mustDecide(t, f, sipReq(user, "c"))
				m[user] = d.Instance().ID
			}
			return m
		}
		before := owner()
		setHealth(t, f, "conv", "i3", registry.HealthUnhealthy)
		during := owner()
		movedOthers, movedOwn := 0, 0
		for k, was := range before {
			switch {
			case was == "i3" && during[k] == "i3":
				t.Fatalf("key %s still on the unhealthy instance", k)
			case was == "i3":
				movedOwn++
			case during[k] != was:
				movedOthers++
			}
		}
		if movedOthers != 0 || movedOwn == 0 {
			t.Errorf("keys of other instances moved: %d; keys of i3 moved: %d", movedOthers, movedOwn)
		}
		setHealth(t, f, "conv", "i3", registry.HealthHealthy)
		if diff := cmp.Diff(before, owner()); diff != "" {
			t.Errorf("keys did not return after recovery (-before +after):\n%s", diff)
		}
	})
	t.Run("without DCR: HTTP is sticky round robin, SIP hashed", func(t *testing.T) {
		f := newFixture(t, false, 3)
		d := mustDecide(t, f, httpReq("alice"))
		if affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session") == "" {
			t.Error("HTTP without DCR got no sticky cookie")
		}
		d.End()
		a := mustDecide(t, f, sipReq("", "call-1"))
		b := mustDecide(t, f, sipReq("", "call-1"))
		if a.Instance().ID != b.Instance().ID {
			t.Error("one call hashed to two instances")
		}
	})
	t.Run("no healthy instance", func(t *testing.T) {
		f := newFixture(t, true, 1)
		setHealth(t, f, "conv", "i1", registry.HealthUnhealthy)
		mustReject(t, f, sipReq("alice", "c"), affinity.ClassNoCapacity)
	})
	t.Run("DCR file reload", func(t *testing.T) {
		f := newFixture(t, true, 8)
		svc, _ := f.Registry.Snapshot().Service("conv")
		// Under the X-User rule both requests share a key; after the reload the rule reads
		// X-Tenant, absent here, so the peer addresses decide.
		byPeer := func() (string, string) {
			a, b := httpReq("alice"), httpReq("alice")
			a.Peer, b.Peer = "192.0.2.1:1000", "192.0.2.99:2000"
			da, db := mustDecide(t, f, a), mustDecide(t, f, b)
			da.End()
			db.End()
			return da.Instance().ID, db.Instance().ID
		}
		if a, b := byPeer(); a != b {
			t.Fatalf("same user on %s and %s", a, b)
		}
		updated := []byte(`<user-centric-rules><http-rules><header name="X-Tenant" return="request.X-Tenant"><exist/></header></http-rules></user-centric-rules>`)
		if err := os.WriteFile(svc.DCRFile, updated, 0o600); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the reloaded rules to apply", func() bool {
			for p := range 20 {
				a, b := httpReq("alice"), httpReq("alice")
				a.Peer, b.Peer = "192.0.2.1:1000", fmt.Sprintf("192.0.2.%d:2000", 100+p)
				da, db := mustDecide(t, f, a), mustDecide(t, f, b)
				da.End()
				db.End()
				if da.Instance().ID != db.Instance().ID {
					return true
				}
			}
			return false
		})
	})
}
