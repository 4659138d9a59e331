package memstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// TestGetOfLiveSessionDoesNotAllocate: Get of an Active session without attributes is served
// by the hot table, with no memdb read transaction and no allocation (the per-request read
// of Decide).
func TestGetOfLiveSessionDoesNotAllocate(t *testing.T) {
	st, _ := sessiontest.NewMemStore(t)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "a"))
	var got session.Session
	allocs := testing.AllocsPerRun(1000, func() {
		var err error
		if got, err = st.Get(context.Background(), "web", "s1"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Get allocates %.1f times per call, want 0", allocs)
	}
	if got.ID != "s1" || got.Service != "web" || got.Instance != "a" || got.Status != session.StatusActive {
		t.Errorf("Get = %+v", got)
	}
}

// TestCountActiveByInstanceFollowsEveryChange: the per-instance counts that replaced the
// memdb instance index agree with ActiveByInstance (a walk of the table) after creates,
// rebinds, kind changes, ends, expiry, purges and a snapshot restore.
func TestCountActiveByInstanceFollowsEveryChange(t *testing.T) {
	ctx := t.Context()
	st, clock := sessiontest.NewMemStore(t, memstore.WithRetention(time.Hour))
	check := func(st *memstore.Store, when string) {
		t.Helper()
		for _, inst := range []string{"a", "b", "c"} {
			list, err := st.ActiveByInstance(ctx, "web", inst)
			if err != nil {
				t.Fatal(err)
			}
			want := map[session.Kind]int{}
			for _, s := range list {
				want[s.Kind]++
			}
			got, err := st.CountActiveByInstance(ctx, "web", inst)
			if err != nil {
				t.Fatal(err)
			}
			Diff(t, fmt.Sprintf("%s: counts of %s", when, inst), want, got)
		}
	}
	for i := range 30 {
		s := sessiontest.Session("web", fmt.Sprintf("s%02d", i), []string{"a", "b", "c"}[i%3])
		if i%5 == 0 {
			s.Kind = session.KindSticky
		}
		if i%4 == 0 {
			s.IdleTimeout = time.Minute
		}
		sessiontest.MustCreate(t, st, s)
	}
	sessiontest.MustCreate(t, st, sessiontest.Session("other", "s00", "a")) // same instance name, other service
	check(st, "created")
	for i := 1; i < 30; i += 7 {
		if _, err := st.Update(ctx, "web", fmt.Sprintf("s%02d", i), func(s *session.Session) error {
			s.Instance, s.Kind = "c", session.KindHeader
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	check(st, "rebound")
	for i := 2; i < 30; i += 6 {
		if _, err := st.End(ctx, "web", fmt.Sprintf("s%02d", i), session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	check(st, "ended")
	clock.Advance(2 * time.Minute)
	if ended, _, err := st.Reap(ctx); err != nil || ended == 0 {
		t.Fatalf("Reap = %d, %v; want some idle sessions ended", ended, err)
	}
	check(st, "reaped")
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	restored, _ := sessiontest.NewMemStore(t, memstore.WithRetention(time.Hour))
	if _, err := restored.RestoreSnapshot(path); err != nil {
		t.Fatal(err)
	}
	check(restored, "restored")
	clock.Advance(2 * time.Hour)
	if _, purged, err := st.Reap(ctx); err != nil || purged == 0 {
		t.Fatalf("Reap = %d purged, %v; want the ended records purged", purged, err)
	}
	check(st, "purged")
	Diff(t, "records after everything lapsed and was purged", 0, st.Len())
}

// TestUpdateShorteningIdleTimeoutExpiresOnTime: the expiry schedule lives outside memdb, and a
// session's item is scheduled at its ExpiresAt when written; an Update that brings the expiry
// forward must be honoured (the old, later item must not keep the session alive), and one that
// pushes it back must not end it early.
func TestUpdateShorteningIdleTimeoutExpiresOnTime(t *testing.T) {
	ctx := t.Context()
	rec := newOnEndRecorder()
	st, clock := sessiontest.NewMemStore(t, memstore.WithOnEnd(rec.record))
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "short", "a"))  // idle 30m
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "longer", "a")) // idle 30m
	set := func(id string, idle time.Duration) {
		if _, err := st.Update(ctx, "web", id, func(s *session.Session) error {
			s.IdleTimeout = idle
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	set("short", time.Minute)
	set("longer", 2*time.Hour)
	clock.Advance(2 * time.Minute)
	if ended, _, err := st.Reap(ctx); err != nil || ended != 1 || len(rec.get("web/short")) != 1 {
		t.Fatalf("Reap after 2m = %d, %v; ends of short %d; want short ended", ended, err, len(rec.get("web/short")))
	}
	clock.Advance(40 * time.Minute) // past the original 30m idle timeout of longer
	if ended, _, err := st.Reap(ctx); err != nil || ended != 0 {
		t.Fatalf("Reap after 42m = %d, %v; want longer kept (its idle timeout is 2h now)", ended, err)
	}
	if got := sessiontest.MustGet(t, st, "web", "longer"); got.Status != session.StatusActive {
		t.Fatalf("longer = %s", got.Status)
	}
}

// TestManyUpdatesKeepTheScheduleBounded: every Update schedules the new version; the items of
// replaced versions are dropped, so a session updated over and over neither grows the store's
// memory without bound nor is reaped by a stale item.
func TestManyUpdatesKeepTheScheduleBounded(t *testing.T) {
	ctx := t.Context()
	st, clock := sessiontest.NewMemStore(t)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "busy", "a"))
	for i := range 20_000 {
		if _, err := st.Update(ctx, "web", "busy", func(s *session.Session) error {
			s.Attributes = map[string]string{"n": fmt.Sprint(i)}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.ScheduledLen(); n > 2*st.Len()+1024 {
		t.Errorf("expiry schedule holds %d items for %d records", n, st.Len())
	}
	clock.Advance(29 * time.Minute)
	if ended, _, err := st.Reap(ctx); err != nil || ended != 0 {
		t.Fatalf("Reap = %d, %v; want nothing ended before the idle timeout", ended, err)
	}
	if got := sessiontest.MustGet(t, st, "web", "busy"); got.Attributes["n"] != "19999" || got.Status != session.StatusActive {
		t.Fatalf("busy = %+v", got)
	}
}
