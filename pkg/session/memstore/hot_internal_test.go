package memstore

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
)

// TestHotTableReadersNeverMissALiveRecord drives the lock-free hot table directly (a miss
// there is invisible through Get, which falls back to memdb, but would drop Touches): readers
// look up a fixed set of records without pause while the one writer inserts, replaces and
// removes thousands of others, so that every shard grows, fills with tombstones and is
// rebuilt several times.
func TestHotTableReadersNeverMissALiveRecord(t *testing.T) {
	st := New()
	tbl := st.hot
	rec := func(id string) *record {
		return st.newRecord(session.Session{ID: id, Service: "web", Instance: "a", Status: session.StatusActive}, nil, nil)
	}
	const fixed = 64
	want := make([]*record, fixed)
	for i := range want {
		want[i] = rec(fmt.Sprintf("fixed-%d", i))
		tbl.put(want[i])
	}
	var stop atomic.Bool
	var misses, reads atomic.Int64
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; !stop.Load() || reads.Load() < 2_000; i++ {
				if i%64 == 0 {
					runtime.Gosched()
				}
				r := want[i%fixed]
				if tbl.get("web", r.id()) != r {
					misses.Add(1)
				}
				reads.Add(1)
			}
		}()
	}
	for round := range 4 {
		churn := make([]*record, 4000)
		for i := range churn {
			churn[i] = rec(fmt.Sprintf("churn-%d-%d", round, i))
			tbl.put(churn[i])
		}
		for i := range churn {
			if i%2 == 0 {
				next := rec(churn[i].id())
				tbl.put(next) // a new version replaces the old in place
				churn[i] = next
			}
		}
		for _, r := range churn {
			if tbl.get("web", r.id()) != r {
				t.Fatalf("round %d: %s not found after its insert", round, r.id())
			}
			tbl.remove(r)
		}
		for _, r := range churn {
			if got := tbl.get("web", r.id()); got != nil {
				t.Fatalf("round %d: %s found after its removal", round, r.id())
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if misses.Load() != 0 {
		t.Errorf("%d of %d lookups of live records missed", misses.Load(), reads.Load())
	}
	if n := tbl.count(); n != fixed {
		t.Errorf("table holds %d records, want %d", n, fixed)
	}
	stale := rec("fixed-0")
	tbl.remove(stale) // not the current version: must not drop fixed-0
	if tbl.get("web", "fixed-0") != want[0] {
		t.Error("removing a stale version dropped the current one")
	}
}

// TestHotTableMirrorsTheIndex: writers find records through the hot table instead of memdb,
// so after every kind of change (create, replace a lapsed session, update, end, expire, purge,
// restore) it must hold exactly the records of the id index, each the current version.
func TestHotTableMirrorsTheIndex(t *testing.T) {
	ctx := t.Context()
	clock := testutil.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st := New(WithClock(clock.Now), WithRetention(time.Hour))
	check := func(st *Store, when string) {
		t.Helper()
		it, err := st.db.Txn(false).Get(tableSessions, indexID)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		ri := recIter{it: it}
		for r := ri.next(); r != nil; r = ri.next() {
			n++
			if st.hot.current(r) != r {
				t.Errorf("%s: the hot table does not hold %q (%s) as current", when, r.id(), statusOf(r.status))
			}
		}
		if got := st.hot.count(); got != n || n != st.Len() {
			t.Errorf("%s: hot table holds %d records, memdb %d, Len %d", when, got, n, st.Len())
		}
	}
	for i := range 200 {
		id := fmt.Sprintf("%032x", i*7919)
		if i%3 == 0 {
			id = fmt.Sprintf("client-%d", i)
		}
		s := session.Session{ID: id, Service: "web", Instance: "a", Kind: session.KindCookie, TTL: time.Hour}
		if i%2 == 0 {
			s.IdleTimeout = time.Minute
		}
		if err := st.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	check(st, "created")
	ids := func() []string {
		var out []string
		page, _, err := st.List(ctx, session.Filter{Service: "web"}, "", session.MaxListLimit)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			out = append(out, s.ID)
		}
		return out
	}()
	for i, id := range ids {
		switch i % 4 {
		case 0:
			if _, err := st.End(ctx, "web", id, session.StatusTerminated, clock.Now()); err != nil {
				t.Fatal(err)
			}
		case 1:
			if _, err := st.Update(ctx, "web", id, func(s *session.Session) error { s.Instance = "b"; return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	check(st, "ended and updated")
	clock.Advance(2 * time.Minute)
	// A lapsed session the reaper has not ended yet is replaced by a Create of its id.
	for i := 2; i < 40; i += 4 { // ids[i] kept its idle timeout only for even i: some lapsed
		if err := st.Create(ctx, session.Session{ID: ids[i], Service: "web", Instance: "c", Kind: session.KindCookie, TTL: time.Hour}); err != nil && !errors.Is(err, session.ErrExists) {
			t.Fatal(err)
		}
	}
	check(st, "replaced")
	if _, _, err := st.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	check(st, "reaped")
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	restored := New(WithClock(clock.Now), WithRetention(time.Hour))
	if _, err := restored.RestoreSnapshot(path); err != nil {
		t.Fatal(err)
	}
	check(restored, "restored")
	clock.Advance(2 * time.Hour)
	if _, purged, err := st.Reap(ctx); err != nil || purged == 0 {
		t.Fatalf("Reap purged %d, %v", purged, err)
	}
	check(st, "purged")
}
