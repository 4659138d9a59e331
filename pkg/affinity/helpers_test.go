package affinity_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// mustDecide decides req and fails the test on any error.
func mustDecide(t testing.TB, f *affinitytest.Fixture, req affinity.Request) affinity.Decision {
	t.Helper()
	d, err := f.Engine.Decide(context.Background(), req)
	if err != nil {
		t.Fatalf("Decide(%s %s): %v", req.Method, req.Path, err)
	}
	return d
}

// mustReject decides req and fails the test unless it is rejected with class want.
func mustReject(t testing.TB, f *affinitytest.Fixture, req affinity.Request, want affinity.Class) {
	t.Helper()
	_ = rejection(t, f, req, want) // rejection checks the class; the value is for callers that inspect it
}

// rejection decides req and returns its *Reject, failing unless it is rejected with class want.
func rejection(t testing.TB, f *affinitytest.Fixture, req affinity.Request, want affinity.Class) *affinity.Reject {
	t.Helper()
	d, err := f.Engine.Decide(context.Background(), req)
	if err == nil {
		d.End()
		t.Fatalf("Decide(%s %s) admitted to %s, want class %d", req.Method, req.Path, d.Instance().ID, want)
	}
	var rej *affinity.Reject
	if !errors.As(err, &rej) {
		t.Fatalf("Decide(%s %s): %v, want a *Reject", req.Method, req.Path, err)
	}
	if rej.Class != want {
		t.Fatalf("Decide(%s %s) rejected with class %d (%v), want %d", req.Method, req.Path, rej.Class, rej, want)
	}
	return rej
}

// cookieReq is a request carrying the session cookie (none when id is "").
func cookieReq(svc, id string) affinity.Request {
	if id == "" {
		return affinitytest.HTTP(svc, "GET", "/")
	}
	return affinitytest.HTTP(svc, "GET", "/", "cookie", "other=1; tether-session="+id)
}

// newCookieSession opens a session with one request and returns its id and instance; the
// request is ended.
func newCookieSession(t testing.TB, f *affinitytest.Fixture, svc string) (id, instance string) {
	t.Helper()
	d := mustDecide(t, f, cookieReq(svc, ""))
	defer d.End()
	id = affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session")
	if id == "" || id != d.SessionID() {
		t.Fatalf("new session: cookie %q, SessionID %q", id, d.SessionID())
	}
	return id, d.Instance().ID
}

func setHealth(t testing.TB, f *affinitytest.Fixture, svc, id string, h registry.Health) {
	t.Helper()
	if _, err := f.Registry.SetHealth(registry.Key{Service: svc, ID: id}, h); err != nil {
		t.Fatal(err)
	}
	f.Sync(t)
}
