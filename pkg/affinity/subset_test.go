package affinity_test

import (
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestSubsetRestrictsTheInstances: a request's Subset (the Inference Extension's subset hint)
// limits placement, sessionless balancing and existing sessions to the listed endpoints, and
// rejects with NoCapacity (503) when none of them can serve.
func TestSubsetRestrictsTheInstances(t *testing.T) {
	ck := affinitytest.Service("ck", registry.AffinityCookie)
	rr := affinitytest.Service("rr", registry.AffinityNone)
	rr.Match = registry.Match{PathPrefix: "/rr"}
	insts := append(affinitytest.Instances("ck", 3), affinitytest.Instances("rr", 3)...)
	f := affinitytest.New(t, []registry.Service{ck, rr}, insts)
	addr := func(svc, id string) string {
		for _, in := range insts {
			if in.Service == svc && in.ID == id {
				return in.HTTPAddr()
			}
		}
		t.Fatalf("no instance %s/%s", svc, id)
		return ""
	}
	with := func(r affinity.Request, subset ...string) affinity.Request { r.Subset = subset; return r }

	// A new session goes where the subset allows, not where placement would put it (i1).
	d := mustDecide(t, f, with(affinitytest.HTTP("ck", "GET", "/"), addr("ck", "i3")))
	if d.Instance().ID != "i3" {
		t.Fatalf("new session placed on %s, want i3 (the only one in the subset)", d.Instance().ID)
	}
	id := d.SessionID()
	d.End()

	// The session follows the subset: outside it, it is rebound into it; inside, it stays.
	d = mustDecide(t, f, with(cookieReq("ck", id), addr("ck", "i2")))
	if d.Instance().ID != "i2" {
		t.Errorf("session on i3 with subset [i2] went to %s, want a rebind to i2", d.Instance().ID)
	}
	d.End()
	d = mustDecide(t, f, with(cookieReq("ck", id), addr("ck", "i1"), addr("ck", "i2")))
	if d.Instance().ID != "i2" {
		t.Errorf("session on i2 with subset [i1 i2] went to %s, want i2", d.Instance().ID)
	}
	d.End()

	// Sessionless round robin stays inside the subset.
	for range 6 {
		d := mustDecide(t, f, with(affinitytest.HTTP("rr", "GET", "/rr"), addr("rr", "i1"), addr("rr", "i3")))
		if d.Instance().ID == "i2" {
			t.Errorf("round robin picked i2 outside the subset")
		}
		d.End()
	}

	// Nothing eligible: 503.
	rej := rejection(t, f, with(affinitytest.HTTP("rr", "GET", "/rr"), "192.0.2.1:80"), affinity.ClassNoCapacity)
	if rej.Code != "NoEligibleInstance" {
		t.Errorf("code %q, want NoEligibleInstance", rej.Code)
	}
	setHealth(t, f, "rr", "i1", registry.HealthUnhealthy)
	mustReject(t, f, with(affinitytest.HTTP("rr", "GET", "/rr"), addr("rr", "i1")), affinity.ClassNoCapacity)
}
