package sessiontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
)

// Factory returns an empty store that reads "now" from clock and keeps ended records for
// session.DefaultRetention.
type Factory func(t *testing.T, clock *testutil.Clock) session.Store

// RunConformance runs the session.Store contract against fresh stores from newStore, one per
// subtest. Expiry is observed through Get and List (no reaper needed), time through clock.
func RunConformance(t *testing.T, newStore Factory) {
	t.Helper()
	for _, tc := range slices.Concat(conformanceCases, contractCases) {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock(Start())
			tc.run(t, newStore(t, clock), clock)
		})
	}
}

type conformanceCase struct {
	name string
	run  func(t *testing.T, st session.Store, clock *testutil.Clock)
}

// Diff fails t with a "(-want +got)" diff when want and got differ.
func Diff(t testing.TB, what string, want, got any) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, d)
	}
}

// MustCreate creates s or fails the test.
func MustCreate(t testing.TB, st session.Store, s session.Session) {
	t.Helper()
	if err := st.Create(context.Background(), s); err != nil {
		t.Fatalf("Create(%s/%s): %v", s.Service, s.ID, err)
	}
}

// MustGet returns the session or fails the test.
func MustGet(t testing.TB, st session.Store, service, id string) session.Session {
	t.Helper()
	s, err := st.Get(context.Background(), service, id)
	if err != nil {
		t.Fatalf("Get(%s/%s): %v", service, id, err)
	}
	return s
}

// Dump returns every session matching f by walking all pages of size limit.
func Dump(t testing.TB, st session.Store, f session.Filter, limit int) []session.Session {
	t.Helper()
	var all []session.Session
	tok := ""
	for pages := 0; ; pages++ {
		page, next, err := st.List(context.Background(), f, tok, limit)
		if err != nil {
			t.Fatalf("List(%+v, %q): %v", f, tok, err)
		}
		all = append(all, page...)
		if next == "" {
			return all
		}
		if pages > 1_000_000 {
			t.Fatalf("List never ends")
		}
		tok = next
	}
}

// keys returns "service/id" of each session.
func keys(ss []session.Session) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.Service+"/"+s.ID)
	}
	return out
}

// active is the session the store must hold right after Create(Session(...)) at now.
func active(service, id, instance string, now time.Time) session.Session {
	s := Session(service, id, instance)
	s.Created, s.LastSeen, s.LastModified, s.Status = now, now, now, session.StatusActive
	return s
}

func wantErr(t *testing.T, what string, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("%s: error %v, want errors.Is(%v)", what, err, target)
		}
	}
}

var conformanceCases = []conformanceCase{
	{"create and get", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		in := Session("web", "s1", "a")
		in.Status = session.StatusTerminated // ignored
		in.Attributes = map[string]string{"user": "u1"}
		MustCreate(t, st, in)
		want := active("web", "s1", "a", t0)
		want.Attributes = map[string]string{"user": "u1"}
		Diff(t, "Get", want, MustGet(t, st, "web", "s1"))
	}},
	{"create keeps given created and last seen", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		in := Session("web", "s1", "a")
		in.Created = t0.Add(-time.Hour)
		in.LastSeen = t0.Add(-time.Minute)
		MustCreate(t, st, in)
		got := MustGet(t, st, "web", "s1")
		Diff(t, "Created", in.Created, got.Created)
		Diff(t, "LastSeen", in.LastSeen, got.LastSeen)
		Diff(t, "LastModified", t0, got.LastModified)
	}},
	{"invalid create is refused and changes nothing", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		MustCreate(t, st, Session("web", "keep", "a"))
		before := Dump(t, st, session.Filter{}, 0)
		mod := func(f func(*session.Session)) session.Session {
			s := Session("web", "s1", "a")
			f(&s)
			return s
		}
		for name, s := range map[string]session.Session{
			"empty id":       mod(func(s *session.Session) { s.ID = "" }),
			"empty service":  mod(func(s *session.Session) { s.Service = "" }),
			"empty instance": mod(func(s *session.Session) { s.Instance = "" }),
			"NUL in id":      mod(func(s *session.Session) { s.ID = "a\x00b" }),
			"NUL in service": mod(func(s *session.Session) { s.Service = "w\x00" }),
			"zero TTL":       mod(func(s *session.Session) { s.TTL = 0 }),
			"negative idle":  mod(func(s *session.Session) { s.IdleTimeout = -time.Second }),
			"lapsed":         mod(func(s *session.Session) { s.Created = clock.Now().Add(-7 * time.Hour) }),
		} {
			wantErr(t, name, st.Create(context.Background(), s), session.ErrInvalid)
		}
		Diff(t, "store after refused creates", before, Dump(t, st, session.Filter{}, 0))
	}},
	{"duplicate active is ErrExists", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		MustCreate(t, st, Session("web", "s1", "a"))
		before := MustGet(t, st, "web", "s1")
		clock.Advance(time.Minute)
		wantErr(t, "second Create", st.Create(context.Background(), Session("web", "s1", "b")), session.ErrExists)
		Diff(t, "session after refused create", before, MustGet(t, st, "web", "s1"))
		// Same id in another service is another session.
		MustCreate(t, st, Session("api", "s1", "b"))
	}},
	{"create replaces an ended record", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		MustCreate(t, st, Session("web", "s1", "a"))
		if _, err := st.End(context.Background(), "web", "s1", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		t1 := clock.Advance(time.Minute)
		MustCreate(t, st, Session("web", "s1", "b"))
		Diff(t, "Get", active("web", "s1", "b", t1), MustGet(t, st, "web", "s1"))
	}},
	{"create replaces a lapsed active record", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		MustCreate(t, st, Session("web", "s1", "a"))
		t1 := clock.Advance(31 * time.Minute) // idle timeout passed
		MustCreate(t, st, Session("web", "s1", "b"))
		Diff(t, "Get", active("web", "s1", "b", t1), MustGet(t, st, "web", "s1"))
	}},
	{"get unknown is ErrNotFound", func(t *testing.T, st session.Store, _ *testutil.Clock) {
		MustCreate(t, st, Session("web", "s1", "a"))
		_, err := st.Get(context.Background(), "web", "nope")
		wantErr(t, "Get unknown id", err, session.ErrNotFound)
		_, err = st.Get(context.Background(), "api", "s1")
		wantErr(t, "Get other service", err, session.ErrNotFound)
	}},
	{"expiry by TTL", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		s := Session("web", "s1", "a")
		s.TTL, s.IdleTimeout = time.Hour, 0
		MustCreate(t, st, s)
		clock.Advance(time.Hour - time.Nanosecond)
		if got := MustGet(t, st, "web", "s1"); got.Status != session.StatusActive {
			t.Fatalf("just before TTL: status %s, want Active", got.Status)
		}
		clock.Advance(time.Nanosecond)
		want := active("web", "s1", "a", t0)
		want.TTL, want.IdleTimeout = time.Hour, 0
		want.Status, want.Ended = session.StatusExpired, t0.Add(time.Hour)
		Diff(t, "at TTL", want, MustGet(t, st, "web", "s1"))
	}},
	{"expiry by idle timeout", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		MustCreate(t, st, Session("web", "s1", "a"))
		clock.Advance(30*time.Minute - time.Nanosecond)
		if got := MustGet(t, st, "web", "s1"); got.Status != session.StatusActive {
			t.Fatalf("just before idle timeout: status %s, want Active", got.Status)
		}
		clock.Advance(time.Nanosecond)
		got := MustGet(t, st, "web", "s1")
		Diff(t, "status", session.StatusExpired, got.Status)
		Diff(t, "ended", t0.Add(30*time.Minute), got.Ended)
	}},
	{"touch keeps a session alive past its first idle deadline", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		MustCreate(t, st, Session("web", "s1", "a"))
		var last time.Time
		for range 10 { // 10 × 20m = 200m, far past the first 30m deadline
			last = clock.Advance(20 * time.Minute)
			touch(t, st, "web", "s1", last)
		}
		got := MustGet(t, st, "web", "s1")
		Diff(t, "status", session.StatusActive, got.Status)
		Diff(t, "LastSeen", last, got.LastSeen)
		clock.Advance(30 * time.Minute)
		got = MustGet(t, st, "web", "s1")
		Diff(t, "status 30m after the last touch", session.StatusExpired, got.Status)
		Diff(t, "ended", last.Add(30*time.Minute), got.Ended)
	}},
	{"touch never extends past TTL", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		s := Session("web", "s1", "a")
		s.TTL, s.IdleTimeout = time.Hour, 30*time.Minute
		MustCreate(t, st, s)
		for range 5 {
			touch(t, st, "web", "s1", clock.Advance(20*time.Minute))
		}
		got := MustGet(t, st, "web", "s1")
		Diff(t, "status", session.StatusExpired, got.Status)
		Diff(t, "ended", t0.Add(time.Hour), got.Ended)
	}},
	{"touch cannot revive a lapsed session", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		MustCreate(t, st, Session("web", "s1", "a"))
		touch(t, st, "web", "s1", clock.Advance(31*time.Minute))
		got := MustGet(t, st, "web", "s1")
		Diff(t, "status", session.StatusExpired, got.Status)
		Diff(t, "LastSeen", t0, got.LastSeen)
	}},
	{"touch with an older time is ignored", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		MustCreate(t, st, Session("web", "s1", "a"))
		touch(t, st, "web", "s1", t0.Add(10*time.Minute))
		touch(t, st, "web", "s1", t0.Add(5*time.Minute))
		Diff(t, "LastSeen", t0.Add(10*time.Minute), MustGet(t, st, "web", "s1").LastSeen)
	}},
	{"touch of unknown or ended sessions does nothing", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		touch(t, st, "web", "nope", clock.Now())
		MustCreate(t, st, Session("web", "s1", "a"))
		ended, err := st.End(context.Background(), "web", "s1", session.StatusTerminated, clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		touch(t, st, "web", "s1", clock.Advance(time.Minute))
		Diff(t, "ended session after touch", ended, MustGet(t, st, "web", "s1"))
	}},
	{"update changes an active session", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		t0 := clock.Now()
		MustCreate(t, st, Session("web", "s1", "a"))
		touch(t, st, "web", "s1", t0.Add(time.Minute))
		t1 := clock.Advance(2 * time.Minute)
		var seen session.Session
		got, err := st.Update(context.Background(), "web", "s1", func(s *session.Session) error {
			seen = *s
			s.Instance = "b"
			s.TTL = time.Hour
			s.DisableReuse = true
			s.Attributes = map[string]string{"k": "v"}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		Diff(t, "fn sees touches", t0.Add(time.Minute), seen.LastSeen)
		want := active("web", "s1", "b", t0)
		want.LastSeen, want.LastModified = t0.Add(time.Minute), t1
		want.TTL, want.DisableReuse, want.Attributes = time.Hour, true, map[string]string{"k": "v"}
		Diff(t, "Update result", want, got)
		Diff(t, "Get after Update", want, MustGet(t, st, "web", "s1"))
	}},
	{"update errors change nothing", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		MustCreate(t, st, Session("web", "live", "a"))
		MustCreate(t, st, Session("web", "ended", "a"))
		if _, err := st.End(ctx, "web", "ended", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		lapsed := Session("web", "lapsed", "a")
		lapsed.IdleTimeout = time.Minute
		MustCreate(t, st, lapsed)
		clock.Advance(2 * time.Minute)
		before := Dump(t, st, session.Filter{}, 0)

		boom := errors.New("boom")
		for _, tc := range []struct {
			name, id string
			fn       func(*session.Session) error
			want     error
		}{
			{"unknown", "nope", func(*session.Session) error { return nil }, session.ErrNotFound},
			{"ended", "ended", func(*session.Session) error { return nil }, session.ErrEnded},
			{"lapsed", "lapsed", func(*session.Session) error { return nil }, session.ErrExpired},
			{"fn error", "live", func(s *session.Session) error { s.Instance = "z"; return boom }, boom},
			{"change id", "live", func(s *session.Session) error { s.ID = "other"; return nil }, session.ErrInvalid},
			{"change service", "live", func(s *session.Session) error { s.Service = "api"; return nil }, session.ErrInvalid},
			{"change status", "live", func(s *session.Session) error { s.Status = session.StatusTerminated; return nil }, session.ErrInvalid},
			{"change created", "live", func(s *session.Session) error { s.Created = s.Created.Add(time.Second); return nil }, session.ErrInvalid},
			{"empty instance", "live", func(s *session.Session) error { s.Instance = ""; return nil }, session.ErrInvalid},
			{"zero TTL", "live", func(s *session.Session) error { s.TTL = 0; return nil }, session.ErrInvalid},
		} {
			_, err := st.Update(ctx, "web", tc.id, tc.fn)
			wantErr(t, tc.name, err, tc.want)
		}
		Diff(t, "store after failed updates", before, Dump(t, st, session.Filter{}, 0))
	}},
	{"end", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		t0 := clock.Now()
		MustCreate(t, st, Session("web", "s1", "a"))
		touch(t, st, "web", "s1", t0.Add(time.Minute))
		t1 := clock.Advance(2 * time.Minute)
		_, err := st.End(ctx, "web", "s1", session.StatusActive, t1)
		wantErr(t, "End with status Active", err, session.ErrInvalid)
		got, err := st.End(ctx, "web", "s1", session.StatusTerminated, t1)
		if err != nil {
			t.Fatal(err)
		}
		want := active("web", "s1", "a", t0)
		want.LastSeen, want.Status, want.Ended = t0.Add(time.Minute), session.StatusTerminated, t1
		Diff(t, "End result", want, got)
		Diff(t, "Get after End", want, MustGet(t, st, "web", "s1"))
		_, err = st.End(ctx, "web", "s1", session.StatusTerminated, t1)
		wantErr(t, "second End", err, session.ErrEnded)
		_, err = st.End(ctx, "web", "nope", session.StatusTerminated, t1)
		wantErr(t, "End unknown", err, session.ErrNotFound)
	}},
	{"end of a lapsed session records the expiry", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		t0 := clock.Now()
		MustCreate(t, st, Session("web", "s1", "a"))
		MustCreate(t, st, Session("web", "s2", "a"))
		t1 := clock.Advance(time.Hour)
		_, err := st.End(ctx, "web", "s1", session.StatusTerminated, t1)
		wantErr(t, "End Terminated of lapsed", err, session.ErrEnded, session.ErrExpired)
		got := MustGet(t, st, "web", "s1")
		Diff(t, "status", session.StatusExpired, got.Status)
		Diff(t, "ended", t0.Add(30*time.Minute), got.Ended)
		got, err = st.End(ctx, "web", "s2", session.StatusExpired, t1)
		if err != nil {
			t.Fatalf("End Expired of lapsed: %v", err)
		}
		Diff(t, "ended", t0.Add(30*time.Minute), got.Ended)
	}},
	{"ended records are kept for the retention", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		MustCreate(t, st, Session("web", "s1", "a"))
		t1 := clock.Advance(time.Minute)
		if _, err := st.End(ctx, "web", "s1", session.StatusTerminated, t1); err != nil {
			t.Fatal(err)
		}
		clock.Set(t1.Add(session.DefaultRetention - time.Nanosecond))
		MustGet(t, st, "web", "s1")
		clock.Set(t1.Add(session.DefaultRetention))
		_, err := st.Get(ctx, "web", "s1")
		wantErr(t, "Get after retention", err, session.ErrNotFound)
		_, err = st.End(ctx, "web", "s1", session.StatusTerminated, clock.Now())
		wantErr(t, "End after retention", err, session.ErrNotFound)
		if got := Dump(t, st, session.Filter{}, 0); len(got) != 0 {
			t.Errorf("List after retention: %v", keys(got))
		}
	}},
	{"attributes are copied in and out", func(t *testing.T, st session.Store, _ *testutil.Clock) {
		in := Session("web", "s1", "a")
		in.Attributes = map[string]string{"k": "v"}
		MustCreate(t, st, in)
		in.Attributes["k"] = "changed by caller"
		got := MustGet(t, st, "web", "s1")
		got.Attributes["k"] = "changed by reader"
		page, _, err := st.List(context.Background(), session.Filter{}, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		page[0].Attributes["k"] = "changed by lister"
		Diff(t, "attributes", map[string]string{"k": "v"}, MustGet(t, st, "web", "s1").Attributes)
	}},
	{"list order, filters and paging", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		for _, k := range []struct{ svc, id, inst string }{
			{"web", "c", "a"}, {"api", "b", "x"}, {"web", "a", "b"}, {"web", "b", "a"},
			{"web", "d", "b"}, {"api", "a", "x"}, {"webx", "a", "a"},
		} {
			MustCreate(t, st, Session(k.svc, k.id, k.inst))
		}
		short := Session("web", "e", "a")
		short.IdleTimeout = time.Minute
		MustCreate(t, st, short) // lapses below: reported Expired
		if _, err := st.End(ctx, "web", "d", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Minute)

		for _, tc := range []struct {
			name string
			f    session.Filter
			want []string
		}{
			{"all", session.Filter{}, []string{"api/a", "api/b", "web/a", "web/b", "web/c", "web/d", "web/e", "webx/a"}},
			{"service", session.Filter{Service: "web"}, []string{"web/a", "web/b", "web/c", "web/d", "web/e"}},
			{"instance", session.Filter{Service: "web", Instance: "a"}, []string{"web/b", "web/c", "web/e"}},
			{"instance without service", session.Filter{Instance: "a"}, []string{"web/b", "web/c", "web/e", "webx/a"}},
			{"instance active", session.Filter{Service: "web", Instance: "a", Status: session.StatusActive}, []string{"web/b", "web/c"}},
			{"id", session.Filter{Service: "web", ID: "a"}, []string{"web/a"}},
			{"id without service", session.Filter{ID: "a"}, []string{"api/a", "web/a", "webx/a"}},
			{"active", session.Filter{Status: session.StatusActive}, []string{"api/a", "api/b", "web/a", "web/b", "web/c", "webx/a"}},
			{"active in service", session.Filter{Service: "web", Status: session.StatusActive}, []string{"web/a", "web/b", "web/c"}},
			{"expired", session.Filter{Status: session.StatusExpired}, []string{"web/e"}},
			{"terminated", session.Filter{Status: session.StatusTerminated}, []string{"web/d"}},
			{"terminated in service", session.Filter{Service: "web", Status: session.StatusTerminated}, []string{"web/d"}},
			{"no match", session.Filter{Service: "nope"}, []string{}},
		} {
			for _, limit := range []int{0, 1, 2, 3, 100} {
				t.Run(fmt.Sprintf("%s/limit=%d", tc.name, limit), func(t *testing.T) {
					got := Dump(t, st, tc.f, limit)
					Diff(t, "keys", tc.want, keys(got))
					for _, s := range got {
						matches := (tc.f.Status == "" || s.Status == tc.f.Status) && (tc.f.Instance == "" || s.Instance == tc.f.Instance)
						if !matches {
							t.Errorf("%s/%s (%s on %s) does not match %+v", s.Service, s.ID, s.Status, s.Instance, tc.f)
						}
					}
				})
			}
		}
		page, next, err := st.List(ctx, session.Filter{Service: "web"}, "", 5)
		if err != nil || len(page) != 5 || next != "" {
			t.Errorf("an exactly full last page: %d sessions, next %q, err %v; want 5, \"\", nil", len(page), next, err)
		}
		_, _, err = st.List(ctx, session.Filter{}, "not a token", 10)
		wantErr(t, "List with a bad token", err, session.ErrInvalidPageToken)
	}},
	{"active by instance", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		for _, k := range []struct{ svc, id, inst string }{
			{"web", "c", "a"}, {"web", "a", "a"}, {"web", "b", "b"}, {"web", "d", "a"}, {"api", "e", "a"},
		} {
			MustCreate(t, st, Session(k.svc, k.id, k.inst))
		}
		if _, err := st.End(ctx, "web", "d", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		touch(t, st, "web", "c", clock.Advance(time.Minute))
		got, err := st.ActiveByInstance(ctx, "web", "a")
		if err != nil {
			t.Fatal(err)
		}
		Diff(t, "sessions", []string{"web/a", "web/c"}, keys(got))
		Diff(t, "touched LastSeen", clock.Now(), got[1].LastSeen)
		if got, _ := st.ActiveByInstance(ctx, "web", "zzz"); len(got) != 0 {
			t.Errorf("unknown instance: %v", keys(got))
		}
	}},
}

// touch touches a session and, on a store that batches touches, flushes them, so the test can
// read the result at once.
func touch(t testing.TB, st session.Store, service, id string, now time.Time) {
	t.Helper()
	st.Touch(context.Background(), service, id, now)
	Flush(t, st)
}

// Flush writes a batching store's pending touches (nothing for a store that has none).
func Flush(t testing.TB, st session.Store) {
	t.Helper()
	if f, ok := st.(session.TouchFlusher); ok {
		if err := f.FlushTouches(context.Background()); err != nil {
			t.Fatalf("FlushTouches: %v", err)
		}
	}
}

// EndRecorder collects the end events of a store handle. Safe for concurrent use.
type EndRecorder struct {
	mu     sync.Mutex
	events []session.EndEvent
	cond   chan struct{}
}

// RecordEnds sets a new EndRecorder as st's end handler.
func RecordEnds(st session.Store) *EndRecorder {
	r := &EndRecorder{cond: make(chan struct{})}
	st.SetEndHandler(func(ev session.EndEvent) {
		r.mu.Lock()
		r.events = append(r.events, ev)
		close(r.cond)
		r.cond = make(chan struct{})
		r.mu.Unlock()
	})
	return r
}

// Events returns the events so far.
func (r *EndRecorder) Events() []session.EndEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// WaitFor waits until ok holds for the events, or fails t after timeout.
func (r *EndRecorder) WaitFor(t testing.TB, timeout time.Duration, what string, ok func([]session.EndEvent) bool) []session.EndEvent {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ev, c := slices.Clone(r.events), r.cond
		r.mu.Unlock()
		if ok(ev) {
			return ev
		}
		select {
		case <-c:
		case <-deadline.C:
			t.Fatalf("%s: not within %v; events so far: %+v", what, timeout, ev)
			return nil
		}
	}
}

// ends summarises events as "service/id status local|remote".
func ends(ev []session.EndEvent) []string {
	out := make([]string, 0, len(ev))
	for _, e := range ev {
		where := "remote"
		if e.Local {
			where = "local"
		}
		out = append(out, fmt.Sprintf("%s/%s %s %s", e.Session.Service, e.Session.ID, e.Session.Status, where))
	}
	return out
}

// contractCases cover the parts of the contract a shared backend relies on: end notification,
// ctx on every call, the atomic reuse guard in Create, and batchable touches.
var contractCases = []conformanceCase{
	{"every end is announced once, locally", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		rec := RecordEnds(st)
		MustCreate(t, st, Session("web", "ended", "a"))
		MustCreate(t, st, Session("web", "lapsed", "a"))
		if _, err := st.End(ctx, "web", "ended", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := st.End(ctx, "web", "ended", session.StatusTerminated, clock.Now()); !errors.Is(err, session.ErrEnded) {
			t.Fatalf("second End: %v, want ErrEnded", err)
		}
		clock.Advance(31 * time.Minute)
		MustCreate(t, st, Session("web", "lapsed", "b")) // replaces the lapsed one: its end is announced
		want := []string{"web/ended Terminated local", "web/lapsed Expired local"}
		got := rec.WaitFor(t, 5*time.Second, "two end events", func(ev []session.EndEvent) bool { return len(ev) >= 2 })
		Diff(t, "end events", want, ends(got))
		Diff(t, "lapsed session's recorded instance", "a", got[1].Session.Instance)
		st.SetEndHandler(nil)
		if _, err := st.End(ctx, "web", "lapsed", session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
		Diff(t, "events after the handler was removed", want, ends(rec.Events()))
	}},
	{"concurrent ends: one wins, one event", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		rec := RecordEnds(st)
		MustCreate(t, st, Session("web", "s1", "a"))
		const n = 8
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				_, err := st.End(ctx, "web", "s1", session.StatusTerminated, clock.Now())
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		won := 0
		for err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, session.ErrEnded):
				t.Errorf("losing End: %v, want ErrEnded", err)
			}
		}
		Diff(t, "winning Ends", 1, won)
		rec.WaitFor(t, 5*time.Second, "one end event", func(ev []session.EndEvent) bool { return len(ev) >= 1 })
		Diff(t, "end events", []string{"web/s1 Terminated local"}, ends(rec.Events()))
	}},
	{"a cancelled ctx fails every call but Touch", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		MustCreate(t, st, Session("web", "s1", "a"))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := st.Create(ctx, Session("web", "s2", "a"))
		wantErr(t, "Create", err, context.Canceled)
		_, err = st.Get(ctx, "web", "s1")
		wantErr(t, "Get", err, context.Canceled)
		_, err = st.Update(ctx, "web", "s1", func(s *session.Session) error { s.Instance = "b"; return nil })
		wantErr(t, "Update", err, context.Canceled)
		_, err = st.End(ctx, "web", "s1", session.StatusTerminated, clock.Now())
		wantErr(t, "End", err, context.Canceled)
		_, _, err = st.List(ctx, session.Filter{}, "", 10)
		wantErr(t, "List", err, context.Canceled)
		_, err = st.ActiveByInstance(ctx, "web", "a")
		wantErr(t, "ActiveByInstance", err, context.Canceled)
		now := clock.Advance(time.Minute)
		st.Touch(ctx, "web", "s1", now) // never blocks, never fails: ctx carries values only
		Flush(t, st)
		got := MustGet(t, st, "web", "s1")
		Diff(t, "instance after the cancelled Update", "a", got.Instance)
		Diff(t, "status after the cancelled End", session.StatusActive, got.Status)
		Diff(t, "LastSeen after a Touch with a cancelled ctx", now, got.LastSeen)
		if _, err := st.Get(context.Background(), "web", "s2"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("Get of the cancelled Create: %v, want ErrNotFound", err)
		}
	}},
	{"create refuses an id whose ended record disables reuse", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		for _, id := range []string{"ended", "lapsed", "reusable"} {
			s := Session("web", id, "a")
			s.DisableReuse = id != "reusable"
			MustCreate(t, st, s)
		}
		for _, id := range []string{"ended", "reusable"} {
			if _, err := st.End(ctx, "web", id, session.StatusTerminated, clock.Now()); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(31 * time.Minute) // "lapsed" idles out, still stored Active
		before := Dump(t, st, session.Filter{}, 0)
		for _, id := range []string{"ended", "lapsed"} {
			wantErr(t, "Create over "+id, st.Create(ctx, Session("web", id, "b")), session.ErrReuseDisabled)
		}
		Diff(t, "store after refused creates", before, Dump(t, st, session.Filter{}, 0))
		MustCreate(t, st, Session("web", "reusable", "b"))
		Diff(t, "reused id's instance", "b", MustGet(t, st, "web", "reusable").Instance)
	}},
	{"the reuse guard is atomic with the insert", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		// Many rounds of: a session that disables reuse is ended while creates of its id race
		// the end. A create may only succeed by replacing nothing (it then got ErrExists from
		// the Active record) — never after the end.
		ctx := context.Background()
		for round := range 20 {
			id := fmt.Sprintf("r%02d", round)
			s := Session("web", id, "a")
			s.DisableReuse = true
			MustCreate(t, st, s)
			var wg sync.WaitGroup
			created := make(chan struct{}, 4)
			for range 4 {
				wg.Go(func() {
					if err := st.Create(ctx, Session("web", id, "b")); err == nil {
						created <- struct{}{}
					} else if !errors.Is(err, session.ErrExists) && !errors.Is(err, session.ErrReuseDisabled) {
						t.Errorf("racing Create: %v", err)
					}
				})
			}
			if _, err := st.End(ctx, "web", id, session.StatusTerminated, clock.Now()); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(created)
			if len(created) > 0 {
				t.Fatalf("round %d: a Create succeeded over a record that disables reuse", round)
			}
			got := MustGet(t, st, "web", id)
			Diff(t, "status", session.StatusTerminated, got.Status)
		}
	}},
	{"touches may be batched: the latest one wins", func(t *testing.T, st session.Store, clock *testutil.Clock) {
		ctx := context.Background()
		if d := st.TouchDelay(); d < 0 || d > time.Minute {
			t.Fatalf("TouchDelay %v: want 0..1m", d)
		}
		MustCreate(t, st, Session("web", "s1", "a"))
		MustCreate(t, st, Session("web", "s2", "a"))
		t0 := clock.Now()
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 100 {
					st.Touch(ctx, "web", "s1", t0.Add(time.Duration(g*100+i)*time.Millisecond))
				}
			})
		}
		wg.Wait()
		st.Touch(ctx, "web", "s2", t0.Add(time.Second))
		Flush(t, st)
		Diff(t, "s1 LastSeen", t0.Add(799*time.Millisecond), MustGet(t, st, "web", "s1").LastSeen)
		Diff(t, "s2 LastSeen", t0.Add(time.Second), MustGet(t, st, "web", "s2").LastSeen)
		// A batched touch must still not extend past the idle deadline it was taken under.
		clock.Advance(40 * time.Minute)
		st.Touch(ctx, "web", "s2", clock.Now())
		Flush(t, st)
		Diff(t, "status after a touch past the deadline", session.StatusExpired, MustGet(t, st, "web", "s2").Status)
	}},
}
