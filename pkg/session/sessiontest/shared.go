package sessiontest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
)

// SharedFactory returns two handles on one empty shared store (two replicas), both reading
// "now" from clock and running whatever background work they need until the test ends.
type SharedFactory func(t *testing.T, clock *testutil.Clock) (a, b session.Store)

// sharedWait bounds how long a change made through one handle may take to reach the other
// (invalidation messages, pub/sub). It is a bound for the test, not a promise of the store.
const sharedWait = 10 * time.Second

// RunSharedConformance runs the rules of session.Store that span handles against fresh pairs
// from newPair, one per subtest.
func RunSharedConformance(t *testing.T, newPair SharedFactory) {
	t.Helper()
	for _, tc := range sharedCases {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock(Start())
			a, b := newPair(t, clock)
			tc.run(t, a, b, clock)
		})
	}
}

var sharedCases = []struct {
	name string
	run  func(t *testing.T, a, b session.Store, clock *testutil.Clock)
}{
	{"changes on one handle are read on the other", func(t *testing.T, a, b session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		MustCreate(t, a, Session("web", "s1", "i1"))
		Diff(t, "instance read through b", "i1", MustGet(t, b, "web", "s1").Instance) // b caches it now
		if _, err := a.Update(ctx, "web", "s1", func(s *session.Session) error { s.Instance = "i2"; return nil }); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyWithin(t, sharedWait, "b reads the new instance", func() bool { return MustGet(t, b, "web", "s1").Instance == "i2" })
		if _, err := a.End(ctx, "web", "s1", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyWithin(t, sharedWait, "b reads the end", func() bool { return MustGet(t, b, "web", "s1").Status == session.StatusTerminated })
		got, err := b.ActiveByInstance(ctx, "web", "i2")
		if err != nil || len(got) != 0 {
			t.Errorf("b.ActiveByInstance after the end: %v, %v", keys(got), err)
		}
		Diff(t, "b lists a's session", []string{"web/s1"}, keys(Dump(t, b, session.Filter{Service: "web"}, 0)))
	}},
	{"an end is local on the handle that made it and remote on the other", func(t *testing.T, a, b session.Store, clock *testutil.Clock) {
		ra, rb := RecordEnds(a), RecordEnds(b)
		MustCreate(t, a, Session("web", "s1", "i1"))
		if _, err := b.End(context.Background(), "web", "s1", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		rb.WaitFor(t, sharedWait, "b's local event", func(ev []session.EndEvent) bool { return len(ev) == 1 })
		ra.WaitFor(t, sharedWait, "a's remote event", func(ev []session.EndEvent) bool { return len(ev) == 1 })
		Diff(t, "b's events", []string{"web/s1 Terminated local"}, ends(rb.Events()))
		Diff(t, "a's events", []string{"web/s1 Terminated remote"}, ends(ra.Events()))
		Diff(t, "a's event instance", "i1", ra.Events()[0].Session.Instance)
	}},
	{"ends racing on both handles: one wins, one local event", func(t *testing.T, a, b session.Store, clock *testutil.Clock) {
		ra, rb := RecordEnds(a), RecordEnds(b)
		for round := range 10 {
			id := "r" + string(rune('a'+round))
			MustCreate(t, a, Session("web", id, "i1"))
			var wg sync.WaitGroup
			var mu sync.Mutex
			won := 0
			for g := range 6 {
				st := a
				if g%2 == 1 {
					st = b
				}
				wg.Go(func() {
					_, err := st.End(context.Background(), "web", id, session.StatusTerminated, clock.Now())
					switch {
					case err == nil:
						mu.Lock()
						won++
						mu.Unlock()
					case !errors.Is(err, session.ErrEnded):
						t.Errorf("losing End: %v", err)
					}
				})
			}
			wg.Wait()
			Diff(t, "winning Ends of "+id, 1, won)
		}
		local := func() int {
			n := 0
			for _, ev := range append(ra.Events(), rb.Events()...) {
				if ev.Local {
					n++
				}
			}
			return n
		}
		testutil.EventuallyWithin(t, sharedWait, "every end announced remotely too", func() bool { return len(ra.Events())+len(rb.Events()) == 20 })
		Diff(t, "local events over both handles", 10, local())
	}},
	{"the reuse guard holds across handles", func(t *testing.T, a, b session.Store, clock *testutil.Clock) {
		s := Session("web", "s1", "i1")
		s.DisableReuse = true
		MustCreate(t, a, s)
		if _, err := b.End(context.Background(), "web", "s1", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "Create on a", a.Create(context.Background(), Session("web", "s1", "i2")), session.ErrReuseDisabled)
	}},
	{"touches of one handle reach the other", func(t *testing.T, a, b session.Store, clock *testutil.Clock) {
		MustCreate(t, a, Session("web", "s1", "i1"))
		MustGet(t, b, "web", "s1")
		now := clock.Advance(20 * time.Minute)
		a.Touch(context.Background(), "web", "s1", now)
		Flush(t, a)
		testutil.EventuallyWithin(t, sharedWait, "b reads a's touch", func() bool { return MustGet(t, b, "web", "s1").LastSeen.Equal(now) })
		clock.Advance(20 * time.Minute) // 40m after creation, 20m after the touch: still Active
		Diff(t, "status through b", session.StatusActive, MustGet(t, b, "web", "s1").Status)
	}},
}
