package affinity_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// Seed scenario 1: 2 sessions per instance; Client1 and Client2 bind to Instance1, Client3 to
// Instance2 once Instance1 is full.
func TestSeedScenario1(t *testing.T) {
	for _, tc := range []struct {
		name          string
		instance2     registry.State
		wantScaleOuts int
	}{
		{"instance2 active", registry.StateActive, 0},
		{"instance2 standby (scale-out)", registry.StateStandby, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := affinitytest.Service("fn", registry.AffinityCookie)
			svc.SessionsPerInstance = 2
			insts := affinitytest.Instances("fn", 2)
			insts[1].State = tc.instance2
			f := affinitytest.New(t, []registry.Service{svc}, insts)

			got := map[string]string{}
			for _, client := range []string{"Client1", "Client2", "Client3"} {
				_, inst := newCookieSession(t, f, "fn")
				got[client] = inst
			}
			want := map[string]string{"Client1": "i1", "Client2": "i1", "Client3": "i2"}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("placement (-want +got):\n%s", d)
			}
			if d := cmp.Diff(map[string][2]int{"i1": {2, 0}, "i2": {1, 0}}, f.Usage(t, "fn")); d != "" {
				t.Errorf("usage (-want +got):\n%s", d)
			}
			so := f.ScaleOuts()
			if len(so) != tc.wantScaleOuts {
				t.Fatalf("scale-out signals: %+v, want %d", so, tc.wantScaleOuts)
			}
			if len(so) == 1 && (so[0].Service != "fn" || so[0].Instance.ID != "i2" || so[0].Desired != 2) {
				t.Errorf("scale-out signal %+v, want fn/i2 desired 2", so[0])
			}
			// Both instances hold sessions and i2 still has room.
			if got := f.Engine.DesiredInstances("fn"); got != 2 {
				t.Errorf("DesiredInstances = %d, want 2", got)
			}
			// Filling i2 asks for a third instance.
			newCookieSession(t, f, "fn")
			if got := f.Engine.DesiredInstances("fn"); got != 3 {
				t.Errorf("DesiredInstances with every instance full = %d, want 3", got)
			}
		})
	}
}

// Seed scenario 2: two sessions on one instance fill its 200 request slots; the 201st concurrent
// request of an existing session gets 429, while a new session goes to another instance and is
// served.
func TestSeedScenario2(t *testing.T) {
	for _, perInstance := range []int{2, 3} {
		t.Run("sessionsPerInstance="+string(rune('0'+perInstance)), func(t *testing.T) {
			svc := affinitytest.Service("fn", registry.AffinityCookie)
			svc.SessionsPerInstance = perInstance
			f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 2))

			var open []affinity.Decision
			defer func() {
				for _, d := range open {
					d.End()
				}
			}()
			var ids []string
			for range 2 { // Client1 and Client2: one request each, still in flight
				d := mustDecide(t, f, cookieReq("fn", ""))
				if d.Instance().ID != "i1" {
					t.Fatalf("client placed on %s, want i1", d.Instance().ID)
				}
				ids = append(ids, affinitytest.SetCookie(d.OnResponse(affinity.Response{Status: 200}), "tether-session"))
				open = append(open, d)
			}
			for i := range 198 { // 198 more concurrent requests of the two sessions
				d := mustDecide(t, f, cookieReq("fn", ids[i%2]))
				if d.Instance().ID != "i1" {
					t.Fatalf("request %d of a session went to %s", i, d.Instance().ID)
				}
				open = append(open, d)
			}
			if u := f.Usage(t, "fn")["i1"]; u[1] != 200 {
				t.Fatalf("i1 requests in flight = %d, want 200", u[1])
			}
			rej := rejection(t, f, cookieReq("fn", ids[0]), affinity.ClassTooManyRequests)
			if rej.RetryAfter != time.Second || rej.Code != "ResourceExhausted" {
				t.Errorf("reject %+v, want ResourceExhausted with RetryAfter 1s", rej)
			}
			// A new session is placed on the other instance and served.
			d := mustDecide(t, f, cookieReq("fn", ""))
			if d.Instance().ID != "i2" || !d.NewSession() {
				t.Errorf("new session on %s (new=%v), want a new session on i2", d.Instance().ID, d.NewSession())
			}
			d.End()
			// Once one request ends, the session is admitted again.
			open[0].End()
			d = mustDecide(t, f, cookieReq("fn", ids[0]))
			if d.Instance().ID != "i1" {
				t.Errorf("after a release the session went to %s, want i1", d.Instance().ID)
			}
			d.End()
		})
	}
}

// Sessions per instance = 1 isolates every session on its own instance; with every instance
// taken, a new session gets ClassNoCapacity.
func TestIsolation(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityHeader)
	svc.SessionsPerInstance = 1
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("fn", 3))
	seen := map[string]bool{}
	for i := range 3 {
		d := mustDecide(t, f, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", "tenant"+string(rune('a'+i))))
		if seen[d.Instance().ID] {
			t.Fatalf("two sessions share instance %s", d.Instance().ID)
		}
		seen[d.Instance().ID] = true
		d.End()
	}
	rej := rejection(t, f, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", "tenantd"), affinity.ClassNoCapacity)
	if rej.RetryAfter != time.Second {
		t.Errorf("RetryAfter = %v, want 1s", rej.RetryAfter)
	}
	// Each tenant keeps reaching its own instance.
	for i := range 3 {
		d := mustDecide(t, f, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", "tenant"+string(rune('a'+i))))
		if d.NewSession() {
			t.Errorf("tenant %d got a new session", i)
		}
		d.End()
	}
}

// Seed scenario 1 continued: scale-out opens "a new instance", so the sessions it put on the
// standby instance come back to it — while it is full too — and keep it until it turns unhealthy,
// when they are rebound to an instance with room, never counted against their old slot. (The
// build before this test rebound them standby → standby, counting each against its own slot:
// the first returned "from i3 to i3", the rest got 503 NoCapacity once the standby was full.)
func TestScaleOutSessionsReturnToTheirStandby(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.SessionsPerInstance = 2
	insts := affinitytest.Instances("fn", 4)
	insts[2].State = registry.StateStandby
	insts[3].State = registry.StateStandby
	f := affinitytest.New(t, []registry.Service{svc}, insts)

	var onStandby []string
	for range 4 {
		newCookieSession(t, f, "fn") // i1 and i2 fill up
	}
	for range 2 { // every active instance is full: scale-out fills the standby i3
		id, inst := newCookieSession(t, f, "fn")
		if inst != "i3" {
			t.Fatalf("scale-out placed a session on %s, want the standby i3", inst)
		}
		onStandby = append(onStandby, id)
	}
	want := map[string][2]int{"i1": {2, 0}, "i2": {2, 0}, "i3": {2, 0}, "i4": {0, 0}}
	for round := range 3 {
		for _, id := range onStandby {
			d := mustDecide(t, f, cookieReq("fn", id))
			if d.Instance().ID != "i3" || d.NewSession() {
				t.Errorf("round %d: session %s went to %s (new=%v), want its standby i3", round, id, d.Instance().ID, d.NewSession())
			}
			d.End()
		}
		if d := cmp.Diff(want, f.Usage(t, "fn")); d != "" {
			t.Fatalf("round %d: usage (-want +got):\n%s", round, d)
		}
	}
	if got := f.Engine.DesiredInstances("fn"); got != 4 {
		t.Errorf("DesiredInstances = %d, want 4 (i1-i3 full)", got)
	}

	// i3 fails: its sessions are rebound, each taking a slot on i4 and freeing its own on i3.
	setHealth(t, f, "fn", "i3", registry.HealthUnhealthy)
	for _, id := range onStandby {
		d := mustDecide(t, f, cookieReq("fn", id))
		if d.Instance().ID != "i4" || d.NewSession() || d.SessionID() != id {
			t.Errorf("after i3 failed, session %s went to %s (new=%v, id %s), want i4 under the same id", id, d.Instance().ID, d.NewSession(), d.SessionID())
		}
		d.End()
	}
	want = map[string][2]int{"i1": {2, 0}, "i2": {2, 0}, "i3": {0, 0}, "i4": {2, 0}}
	if d := cmp.Diff(want, f.Usage(t, "fn")); d != "" {
		t.Errorf("usage after the rebind (-want +got):\n%s", d)
	}
}

// A session the SessionAPI creates on a standby instance (scale-out, every active instance
// full) is served there on its first and later requests.
func TestAPISessionOnStandbyIsServed(t *testing.T) {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.SessionsPerInstance = 2
	insts := affinitytest.Instances("fn", 2)
	insts[1].State = registry.StateStandby
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	newCookieSession(t, f, "fn")
	newCookieSession(t, f, "fn")
	var ids []string
	for range 2 {
		s, err := f.Engine.CreateSession(t.Context(), "fn", affinity.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Instance != "i2" {
			t.Fatalf("API session placed on %s, want the standby i2", s.Instance)
		}
		ids = append(ids, s.ID)
	}
	for range 2 {
		for _, id := range ids {
			d := mustDecide(t, f, cookieReq("fn", id))
			if d.Instance().ID != "i2" {
				t.Errorf("API session %s went to %s, want i2", id, d.Instance().ID)
			}
			d.End()
		}
	}
}
