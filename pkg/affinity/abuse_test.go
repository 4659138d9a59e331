package affinity_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// TestJarlessClientCannotFillTheService (#14 finding 3): a client without a cookie jar opens a
// new session with every request. The per-client limit stops it after its burst (429 with a
// retry hint), its sessions stay provisional and free their slots after the provisional idle
// timeout, while other visitors get sessions, keep them when they come back, and trusted
// networks are not limited.
func TestJarlessClientCannotFillTheService(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie) // 3 x 20 = 60 session slots
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 3),
		affinitytest.WithEngineOptions(
			affinity.WithNewSessionLimit(affinity.NewSessionLimit{PerSecond: 2, Burst: 20, Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}),
			affinity.WithProvisionalIdleTimeout(30*time.Second)))
	from := func(peer, id string) affinity.Request {
		r := cookieReq("web", id)
		r.Peer = peer
		return r
	}
	sessions := func() int {
		n := 0
		for _, u := range f.Usage(t, "web") {
			n += u[0]
		}
		return n
	}

	admitted := 0
	for i := range 100 {
		d, err := f.Engine.Decide(context.Background(), from("203.0.113.5:"+strconv.Itoa(40000+i), ""))
		if err != nil {
			var rej *affinity.Reject
			if !errors.As(err, &rej) || rej.Class != affinity.ClassTooManyRequests || rej.Code != "NewSessionRateLimited" || rej.RetryAfter < time.Second {
				t.Fatalf("request %d refused with %v, want a NewSessionRateLimited 429 with a retry hint", i, err)
			}
			continue
		}
		d.OnResponse(affinity.Response{Status: 200})
		d.End()
		admitted++
	}
	if admitted != 20 || sessions() != 20 {
		t.Fatalf("the jar-less client opened %d sessions (%d held); want its burst of 20", admitted, sessions())
	}

	// Another visitor gets a session and keeps it by coming back with its cookie.
	d := mustDecide(t, f, from("198.51.100.7:5000", ""))
	id := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session")
	d.End()
	if s, err := f.Store.Get(context.Background(), "web", id); err != nil || s.IdleTimeout != 30*time.Second || s.Attributes[affinity.ProvisionalAttribute] == "" {
		t.Fatalf("new session %+v, %v: want provisional with a 30s idle timeout", s, err)
	}
	mustDecide(t, f, from("198.51.100.7:5001", id)).End()
	if s, err := f.Store.Get(context.Background(), "web", id); err != nil || s.IdleTimeout != svc.IdleTimeout || s.Attributes[affinity.ProvisionalAttribute] != "" {
		t.Fatalf("returning session %+v, %v: want promoted to the service's idle timeout", s, err)
	}

	// Trusted networks are not limited.
	for i := range 25 {
		d := mustDecide(t, f, from("10.1.2.3:"+strconv.Itoa(1000+i), ""))
		d.End()
	}

	// The jar-less and trusted clients never came back: their slots are free after 30 s.
	f.Clock.Advance(31 * time.Second)
	f.Reap(t)
	if n := sessions(); n != 1 {
		t.Fatalf("%d sessions held after the provisional timeout, want only the returning visitor's", n)
	}
	if s, err := f.Store.Get(context.Background(), "web", id); err != nil || s.Status != session.StatusActive {
		t.Fatalf("the returning visitor's session: %+v, %v", s, err)
	}
}

// anonymousLimits are the config file's defaults (config.NewSessions).
var anonymousLimits = affinity.NewSessionLimit{PerSecond: 2, Burst: 20, Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	MaxSessions: 40, ServiceShare: 0.25, WideFactor: 4}

// holdAfter runs one anonymous client against a 600-slot cookie service (30 instances × 20)
// for the fixture clock's span seconds, one new-session attempt every 100 ms (peer(i) is the
// i-th attempt's source address); a returning client sends each new cookie back once at
// once. It returns the sessions the service holds at the end (after the reaper).
func holdAfter(t *testing.T, limit affinity.NewSessionLimit, span time.Duration, returning bool, peer func(i int) string) int {
	t.Helper()
	svc := affinitytest.Service("web", registry.AffinityCookie)
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 30),
		affinitytest.WithEngineOptions(affinity.WithNewSessionLimit(limit), affinity.WithProvisionalIdleTimeout(30*time.Second)))
	from := func(p, id string) affinity.Request {
		r := cookieReq("web", id)
		r.Peer = p
		return r
	}
	for i := 0; time.Duration(i)*100*time.Millisecond < span; i++ {
		d, err := f.Engine.Decide(context.Background(), from(peer(i), ""))
		if err == nil {
			id := affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session")
			d.End()
			if returning {
				if d2, err := f.Engine.Decide(context.Background(), from(peer(i), id)); err == nil {
					d2.End()
				}
			}
		} else {
			var rej *affinity.Reject
			if !errors.As(err, &rej) || rej.Class != affinity.ClassTooManyRequests {
				t.Fatalf("attempt %d: %v, want a 429", i, err)
			}
		}
		f.Clock.Advance(100 * time.Millisecond)
		if i%10 == 9 {
			f.Reap(t)
		}
	}
	f.Reap(t)
	n := 0
	for _, u := range f.Usage(t, "web") {
		n += u[0]
	}
	return n
}

// TestAnonymousClientCeilings is #25 finding 2: on the landed build (a rate limit only) a
// client returning each cookie once held 99 sessions after 40 s and kept growing (139 after
// 60 s in this harness), a new IPv6 /64 per request filled all 600 slots in 10 s, and requests
// without a source address were not limited at all (600 in 1 s). With the per-bucket ceilings
// (the defaults) each is bounded. The README's table is the 60 s rows (t.Log); the landed
// build's numbers come from this harness run against it with its limiter (see the note).
func TestAnonymousClientCeilings(t *testing.T) {
	one := func(int) string { return "203.0.113.5:40000" }
	same64 := func(i int) string { return fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1) }
	new64 := func(i int) string { return fmt.Sprintf("[2001:db8:1:%x::1]:443", i+1) }
	noAddr := func(i int) string { return []string{"", "unknown", "garbage:port"}[i%3] }

	// The finding's attacks, bounded.
	if n := holdAfter(t, anonymousLimits, 40*time.Second, true, one); n > 40 {
		t.Errorf("returning client held %d sessions after 40 s, want ≤ 40 (its ceiling)", n)
	}
	if n := holdAfter(t, anonymousLimits, 10*time.Second, false, new64); n > 150 {
		t.Errorf("a new /64 per request held %d sessions after 10 s, want ≤ 150 (one /48: min(4 × 40, 25%% of 600))", n)
	}
	if n := holdAfter(t, anonymousLimits, time.Second, false, noAddr); n > 20 {
		t.Errorf("requests without a source address held %d sessions after 1 s, want ≤ 20 (one shared bucket's burst)", n)
	}

	// The table: sessions held after 60 s, returning or not, with the defaults.
	for _, row := range []struct {
		name string
		peer func(int) string
		max  int
	}{
		{"one address", one, 40}, {"one /64", same64, 40}, {"one /48 (a new /64 each request)", new64, 150},
		{"no source address", noAddr, 40},
	} {
		ret := holdAfter(t, anonymousLimits, 60*time.Second, true, row.peer)
		non := holdAfter(t, anonymousLimits, 60*time.Second, false, row.peer)
		t.Logf("| %s | %d | %d |", row.name, ret, non)
		if ret > row.max || non > row.max {
			t.Errorf("%s: held %d (returning) / %d (not), want ≤ %d", row.name, ret, non, row.max)
		}
	}
}

// TestClientCeilingUnderConcurrency: concurrent new-session requests of one client never take
// it past its ceiling (the claim is taken under the limiter's lock), and failed attempts give
// their claims back.
func TestClientCeilingUnderConcurrency(t *testing.T) {
	lim := anonymousLimits
	lim.PerSecond, lim.Burst = 10000, 10000 // the ceiling alone
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, affinitytest.Instances("web", 30),
		affinitytest.WithEngineOptions(affinity.WithNewSessionLimit(lim)))
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				r := cookieReq("web", "")
				r.Peer = fmt.Sprintf("203.0.113.5:%d", 1000+g*100+i)
				d, err := f.Engine.Decide(context.Background(), r)
				if err != nil {
					continue
				}
				d.OnResponse(affinity.Response{Status: 200})
				d.End()
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	n := 0
	for _, u := range f.Usage(t, "web") {
		n += u[0]
	}
	if admitted.Load() != 40 || n != 40 {
		t.Errorf("8 concurrent senders of one client: %d admitted, %d held; want exactly its ceiling of 40", admitted.Load(), n)
	}
}
