package affinity_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// 1000 goroutines hammer one session's instance: never more than the request cap admitted at
// once, every refusal is a 429, and every slot comes back.
func TestRequestCapUnderContention(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.RequestSlotsPerInstance = 200
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 2))
	id, inst := newCookieSession(t, f, "fn")

	// 1000 concurrent requests that keep their slots: exactly the cap is admitted, the cap is
	// reached, and every other request is refused with 429.
	held := make(chan affinity.Decision, 1000)
	var holders sync.WaitGroup
	gate := make(chan struct{})
	for range 1000 {
		holders.Go(func() {
			<-gate
			d, err := f.Engine.Decide(context.Background(), cookieReq("fn", id))
			var rej *affinity.Reject
			switch {
			case err == nil:
				held <- d
			case !errors.As(err, &rej) || rej.Class != affinity.ClassTooManyRequests:
				t.Errorf("holding request: %v", err)
			}
		})
	}
	close(gate)
	holders.Wait()
	close(held)
	if n, u := len(held), f.Usage(t, "fn")[inst]; n != 200 || u[1] != 200 {
		t.Fatalf("%d requests admitted while all held their slots (%d slots in use), want exactly the cap, 200", n, u[1])
	}
	for d := range held {
		d.End()
	}

	var inFlight, maxInFlight, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 1000)
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 20 {
				d, err := f.Engine.Decide(context.Background(), cookieReq("fn", id))
				if err != nil {
					var rej *affinity.Reject
					if !errors.As(err, &rej) || rej.Class != affinity.ClassTooManyRequests {
						errs <- err
						return
					}
					refused.Add(1)
					runtime.Gosched()
					continue
				}
				if d.Instance().ID != inst {
					errs <- errors.New("request routed off its session's instance: " + d.Instance().ID)
				}
				n := inFlight.Add(1)
				for {
					m := maxInFlight.Load()
					if n <= m || maxInFlight.CompareAndSwap(m, n) {
						break
					}
				}
				admitted.Add(1)
				runtime.Gosched()
				inFlight.Add(-1)
				d.End()
				d.End() // a second End must not release again
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if m := maxInFlight.Load(); m > 200 {
		t.Fatalf("%d requests admitted concurrently, cap 200", m)
	}
	if admitted.Load() == 0 || admitted.Load()+refused.Load() != 20000 {
		t.Fatalf("admitted %d + refused %d, want 20000 with some admitted", admitted.Load(), refused.Load())
	}
	if u := f.Usage(t, "fn")[inst]; u[1] != 0 {
		t.Fatalf("%d request slots still held after every End", u[1])
	}
	t.Logf("admitted %d, refused %d, max in flight %d", admitted.Load(), refused.Load(), maxInFlight.Load())
}

// New sessions are placed only on healthy active instances; standby only by scale-out; never
// on draining or unhealthy instances.
func TestPlacementSkipsUnhealthyDrainingStandby(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.SessionsPerInstance = 2
	insts := affinitytest.Instances("fn", 5)
	insts[1].State = registry.StateDraining
	insts[2].State = registry.StateStandby
	insts[4].State = registry.StateStandby
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	setHealth(t, f, "fn", "i1", registry.HealthUnhealthy)
	setHealth(t, f, "fn", "i5", registry.HealthUnhealthy)

	var got []string
	for range 4 {
		_, inst := newCookieSession(t, f, "fn")
		got = append(got, inst)
	}
	if d := cmp.Diff([]string{"i4", "i4", "i3", "i3"}, got); d != "" {
		t.Errorf("placements (-want +got):\n%s", d)
	}
	if n := len(f.ScaleOuts()); n != 1 {
		t.Errorf("%d scale-out signals, want 1 (the first session opened the standby i3; the second only filled it)", n)
	}
	mustReject(t, f, cookieReq("fn", ""), affinity.ClassNoCapacity)
	// The unhealthy standby recovering makes room again, by scale-out.
	setHealth(t, f, "fn", "i5", registry.HealthHealthy)
	if _, inst := newCookieSession(t, f, "fn"); inst != "i5" {
		t.Errorf("after i5 recovered the session went to %s", inst)
	}
}

// A draining instance keeps serving its existing sessions but takes no new ones.
func TestDrainingKeepsSessions(t *testing.T) {
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("fn", registry.AffinityCookie)}, affinitytest.Instances("fn", 2))
	id, inst := newCookieSession(t, f, "fn")
	if err := f.Registry.SetState(registry.Key{Service: "fn", ID: inst}, registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
	d := mustDecide(t, f, cookieReq("fn", id))
	if d.Instance().ID != inst || d.NewSession() {
		t.Errorf("existing session went to %s (new=%v), want %s", d.Instance().ID, d.NewSession(), inst)
	}
	d.End()
	for range 3 {
		if _, other := newCookieSession(t, f, "fn"); other == inst {
			t.Fatalf("new session placed on draining %s", inst)
		}
	}
	// WaitDrained returns once its session is gone.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Engine.WaitDrained(ctx, registry.Key{Service: "fn", ID: inst}) }()
	select {
	case err := <-done:
		t.Fatalf("WaitDrained returned %v with a session left", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := f.Engine.DeleteSession(ctx, "fn", id); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WaitDrained: %v", err)
	}
}

// Idle timeout and TTL end sessions through the store's reaper and free their slots.
func TestExpiryFreesSlots(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.SessionTTL = time.Hour
	svc.IdleTimeout = 10 * time.Minute
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 1), affinitytest.WithoutRun())

	t.Run("idle", func(t *testing.T) {
		id, _ := newCookieSession(t, f, "fn")
		f.Clock.Advance(9 * time.Minute)
		mustDecide(t, f, cookieReq("fn", id)).End() // touches: idle timer restarts
		f.Clock.Advance(9 * time.Minute)
		f.Reap(t)
		if u := f.Usage(t, "fn")["i1"]; u[0] != 1 {
			t.Fatalf("sessions = %d after a touched idle period, want 1", u[0])
		}
		f.Clock.Advance(2 * time.Minute)
		f.Reap(t)
		if u := f.Usage(t, "fn")["i1"]; u[0] != 0 {
			t.Fatalf("sessions = %d after idle expiry, want 0", u[0])
		}
		s, err := f.Store.Get(context.Background(), "fn", id)
		if err != nil || s.Status != session.StatusExpired {
			t.Fatalf("record %+v, %v; want Expired", s, err)
		}
		// The expired id starts a new session under the same id (reuse allowed).
		d := mustDecide(t, f, cookieReq("fn", id))
		if !d.NewSession() || d.SessionID() != id {
			t.Errorf("expired id: new=%v id=%q, want a new session under %q", d.NewSession(), d.SessionID(), id)
		}
		if c := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session"); c != id {
			t.Errorf("re-issued cookie %q, want %q", c, id)
		}
		d.End()
		if err := f.Engine.DeleteSession(context.Background(), "fn", id); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ttl", func(t *testing.T) {
		id, _ := newCookieSession(t, f, "fn")
		for range 11 { // busy for 55 minutes
			f.Clock.Advance(5 * time.Minute)
			mustDecide(t, f, cookieReq("fn", id)).End()
		}
		f.Reap(t)
		if u := f.Usage(t, "fn")["i1"]; u[0] != 1 {
			t.Fatalf("sessions = %d before the TTL, want 1", u[0])
		}
		f.Clock.Advance(5 * time.Minute)
		f.Reap(t)
		if u := f.Usage(t, "fn")["i1"]; u[0] != 0 {
			t.Fatalf("sessions = %d after the TTL, want 0", u[0])
		}
	})
}

// Cookie and header sessions whose instance turns unhealthy or disappears are rebound on their
// next request, keeping their id and moving their session slot.
func TestRebindOnInstanceLoss(t *testing.T) {
	for _, mode := range []registry.AffinityMode{registry.AffinityCookie, registry.AffinityHeader} {
		for _, loss := range []string{"unhealthy", "removed"} {
			t.Run(string(mode)+"/"+loss, func(t *testing.T) {
				insts := affinitytest.Instances("fn", 3)
				f := affinitytest.New(t, []registry.Service{affinitytest.Service("fn", mode)}, insts)
				req := func(id string) affinity.Request {
					if mode == registry.AffinityCookie {
						return cookieReq("fn", id)
					}
					return affinitytest.HTTP("fn", "GET", "/", "x-tether-session", id)
				}
				first := "abc"
				if mode == registry.AffinityCookie {
					first = "" // no cookie yet
				}
				d := mustDecide(t, f, req(first))
				id := d.SessionID()
				from := d.Instance().ID
				d.OnResponse(affinity.Response{Status: 200})
				d.End()
				switch loss {
				case "unhealthy":
					setHealth(t, f, "fn", from, registry.HealthUnhealthy)
				case "removed":
					if err := f.Registry.Deregister(registry.Key{Service: "fn", ID: from}); err != nil {
						t.Fatal(err)
					}
					f.Sync(t)
				}
				d = mustDecide(t, f, req(id))
				to := d.Instance().ID
				d.End()
				if to == from || d.SessionID() != id || d.NewSession() {
					t.Fatalf("after loss: instance %s (was %s), id %q (was %q), new=%v", to, from, d.SessionID(), id, d.NewSession())
				}
				s, err := f.Store.Get(context.Background(), "fn", id)
				if err != nil || s.Instance != to || s.Status != session.StatusActive {
					t.Fatalf("stored session %+v, %v; want Active on %s", s, err, to)
				}
				u := f.Usage(t, "fn")
				if u[to][0] != 1 || (loss == "unhealthy" && u[from][0] != 0) {
					t.Errorf("usage after rebind %v: want 1 session on %s and none on %s", u, to, from)
				}
				// It sticks to the new instance.
				d = mustDecide(t, f, req(id))
				if d.Instance().ID != to {
					t.Errorf("next request went to %s, want %s", d.Instance().ID, to)
				}
				d.End()
			})
		}
	}
}

func TestCookieAffinity(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.Cookie = registry.Cookie{Name: "tether-session", Path: "/app", Secure: true, HTTPOnly: true, SameSite: "Strict"}
	svc.SessionTTL = 2 * time.Hour
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 2))

	t.Run("set-cookie", func(t *testing.T) {
		d := mustDecide(t, f, cookieReq("fn", ""))
		defer d.End()
		hv := d.OnResponse(affinity.Response{Status: 200, Headers: map[string][]string{"set-cookie": {"app=1"}}})
		want := []affinity.HeaderValue{{Name: "set-cookie", Append: true,
			Value: "tether-session=" + d.SessionID() + "; Max-Age=7200; Path=/app; HttpOnly; Secure; SameSite=Strict"}}
		if diff := cmp.Diff(want, hv); diff != "" {
			t.Errorf("response headers (-want +got):\n%s", diff)
		}
		if !session.IsGeneratedID(d.SessionID()) {
			t.Errorf("session id %q is not a generated id", d.SessionID())
		}
	})
	t.Run("sticks", func(t *testing.T) {
		id, inst := newCookieSession(t, f, "fn")
		for range 10 {
			d := mustDecide(t, f, cookieReq("fn", id))
			if d.Instance().ID != inst || d.NewSession() || d.SessionID() != id {
				t.Fatalf("request went to %s new=%v id=%q", d.Instance().ID, d.NewSession(), d.SessionID())
			}
			if hv := d.OnResponse(affinity.Response{Status: 200}); len(hv) != 0 {
				t.Errorf("existing session response adds %v", hv)
			}
			d.End()
		}
	})
	t.Run("malformed", func(t *testing.T) {
		for _, v := range []string{"", "short", strings.Repeat("A", 32), strings.Repeat("g", 32), strings.Repeat("a", 33)} {
			rej := rejection(t, f, affinitytest.HTTP("fn", "GET", "/", "cookie", "tether-session="+v), affinity.ClassBadRequest)
			if rej.Code != "InvalidSessionId" {
				t.Errorf("cookie %q: code %q", v, rej.Code)
			}
		}
	})
	t.Run("unknown id gets a new id", func(t *testing.T) {
		forged := strings.Repeat("ab", 16)
		d := mustDecide(t, f, cookieReq("fn", forged))
		defer d.End()
		if !d.NewSession() || d.SessionID() == forged {
			t.Fatalf("forged id: new=%v id=%q; want a new session under a new id", d.NewSession(), d.SessionID())
		}
		if c := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session"); c != d.SessionID() {
			t.Errorf("cookie %q, want %q", c, d.SessionID())
		}
		if _, err := f.Store.Get(context.Background(), "fn", forged); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("forged id was stored: %v", err)
		}
	})
}

func TestDisableSessionIDReuse(t *testing.T) {
	for _, mode := range []registry.AffinityMode{registry.AffinityCookie, registry.AffinityHeader} {
		t.Run(string(mode), func(t *testing.T) {
			svc := affinitytest.Service("fn", mode)
			svc.DisableSessionIDReuse = true
			svc.IdleTimeout = time.Minute
			f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 2), affinitytest.WithoutRun())
			req := func(id string) affinity.Request {
				if mode == registry.AffinityCookie {
					return cookieReq("fn", id)
				}
				return affinitytest.HTTP("fn", "GET", "/", "x-tether-session", id)
			}
			first := "client-1"
			if mode == registry.AffinityCookie {
				first = ""
			}
			d := mustDecide(t, f, req(first))
			id := d.SessionID()
			d.End()
			f.Clock.Advance(2 * time.Minute)
			// Lapsed but not reaped yet, then reaped: refused both times.
			rej := rejection(t, f, req(id), affinity.ClassConflict)
			if rej.Code != "SessionIdReuseDisabled" {
				t.Errorf("code %q", rej.Code)
			}
			f.Reap(t)
			mustReject(t, f, req(id), affinity.ClassConflict)
			if u := f.Usage(t, "fn"); u["i1"][0]+u["i2"][0] != 0 {
				t.Errorf("expired session still holds a slot: %v", u)
			}
		})
	}
}
