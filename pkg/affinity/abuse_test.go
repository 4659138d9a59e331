package affinity_test

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
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
