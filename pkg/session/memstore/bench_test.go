package memstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// benchStore returns a store holding n Active sessions of service "web" spread over 20
// instances, and their ids. It is filled through RestoreSnapshot (one transaction, much faster
// than n Creates); the resulting tables are the same.
func benchStore(b *testing.B, n int) (*memstore.Store, *testutil.Clock, []string) {
	b.Helper()
	st, clock := sessiontest.NewMemStore(b)
	now := clock.Now()
	ids := make([]string, n)
	ss := make([]session.Session, n)
	for i := range n {
		ids[i] = benchID(i)
		ss[i] = sessiontest.Session("web", ids[i], "inst"+strconv.Itoa(i%20))
		ss[i].Created, ss[i].LastModified, ss[i].LastSeen, ss[i].Status = now, now, now, session.StatusActive
	}
	slices.SortFunc(ss, func(a, b session.Session) int { return strings.Compare(a.ID, b.ID) })
	path := filepath.Join(b.TempDir(), "bench.snap")
	writeSnapshotFile(b, path, now, ss)
	if got, err := st.RestoreSnapshot(path); err != nil || got != n {
		b.Fatalf("RestoreSnapshot = %d, %v", got, err)
	}
	return st, clock, ids
}

// benchID returns a 32-hex-character id like NewID's, deterministic for i.
func benchID(i int) string { return fmt.Sprintf("%016x%016x", uint64(i)*0x9e3779b97f4a7c15, i) }

func BenchmarkGet(b *testing.B) {
	st, _, ids := benchStore(b, 100_000)
	ctx := context.Background()
	b.ReportAllocs()
	defer testutil.CPUPerOp(b)()
	i := 0
	for b.Loop() {
		if _, err := st.Get(ctx, "web", ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkGetParallel(b *testing.B) {
	st, _, ids := benchStore(b, 100_000)
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		for pb.Next() {
			if _, err := st.Get(ctx, "web", ids[i%len(ids)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkTouch is the per-request idle-timer refresh; compare with BenchmarkUpdateLastSeen,
// the memdb write transaction it replaces.
func BenchmarkTouch(b *testing.B) {
	st, clock, ids := benchStore(b, 100_000)
	now := clock.Now()
	b.ReportAllocs()
	defer testutil.CPUPerOp(b)()
	i := 0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		st.Touch(context.Background(), "web", ids[i%len(ids)], now)
		i++
	}
}

func BenchmarkTouchParallel(b *testing.B) {
	st, clock, ids := benchStore(b, 100_000)
	now := clock.Now()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		t := now
		for pb.Next() {
			t = t.Add(time.Microsecond)
			st.Touch(context.Background(), "web", ids[i%len(ids)], t)
			i++
		}
	})
}

// BenchmarkUpdateLastSeen is the baseline for BenchmarkTouch: refreshing LastSeen with a memdb
// write transaction per request, which Touch avoids.
func BenchmarkUpdateLastSeen(b *testing.B) {
	st, clock, ids := benchStore(b, 100_000)
	ctx := context.Background()
	now := clock.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		if _, err := st.Update(ctx, "web", ids[i%len(ids)], func(s *session.Session) error {
			s.LastSeen = now
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkCreate(b *testing.B) {
	st, _, _ := benchStore(b, 100_000)
	ctx := context.Background()
	s := sessiontest.Session("web", "", "inst0")
	b.ReportAllocs()
	defer testutil.CPUPerOp(b)()
	i := 100_000
	for b.Loop() {
		s.ID = benchID(i)
		if err := st.Create(ctx, s); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkEnd(b *testing.B) {
	st, clock, ids := benchStore(b, 100_000)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(ids) { // every session ended: start over with a fresh store
			b.StopTimer()
			st, clock, ids = benchStore(b, len(ids))
			i = 0
			b.StartTimer()
		}
		if _, err := st.End(ctx, "web", ids[i], session.StatusTerminated, clock.Now()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkList1000(b *testing.B) {
	st, _, _ := benchStore(b, 100_000)
	ctx := context.Background()
	b.ReportAllocs()
	tok := ""
	for b.Loop() {
		_, next, err := st.List(ctx, session.Filter{Service: "web"}, tok, 1000)
		if err != nil {
			b.Fatal(err)
		}
		tok = next
	}
}

// BenchmarkReap measures one reaper pass ending 10k lapsed sessions among 100k.
func BenchmarkReap10kOf100k(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		st, clock, ids := benchStore(b, 100_000)
		for i := 0; i < len(ids); i += 10 {
			if _, err := st.Update(ctx, "web", ids[i], func(s *session.Session) error {
				s.IdleTimeout = time.Minute
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		clock.Advance(2 * time.Minute)
		b.StartTimer()
		if ended, _, err := st.Reap(ctx); err != nil || ended != 10_000 {
			b.Fatalf("Reap = %d, %v", ended, err)
		}
	}
}

// BenchmarkMemoryPerSession reports the heap bytes one live session costs in a store of 1M
// sessions (record, its one memdb index entry, hot-table slot, expiry item), measured with
// runtime.MemStats around filling the store. Run it with -benchtime=1x: one iteration builds
// 1M sessions. benchID's ids are generated-looking (32 hex digits) but less random than
// NewID's; BenchmarkLiveSessionMemory in pkg/affinity measures NewID's through the engine.
func BenchmarkMemoryPerSession(b *testing.B) {
	const n = 1_000_000
	ids := make([]string, n) // ids are the caller's strings: allocate them outside the measurement
	for i := range ids {
		ids[i] = benchID(i)
	}
	ctx := context.Background()
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		st, _ := sessiontest.NewMemStore(b)
		for i, id := range ids {
			s := sessiontest.Session("web", id, "inst"+strconv.Itoa(i%200))
			if err := st.Create(ctx, s); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/session")
		runtime.KeepAlive(st)
	}
}

// BenchmarkSnapshot100k measures SaveSnapshot and RestoreSnapshot of 100k sessions.
func BenchmarkSnapshot100k(b *testing.B) {
	st, clock := bigStore(b, 100_000)
	path := filepath.Join(b.TempDir(), "s.snap")
	b.Run("save", func(b *testing.B) {
		for b.Loop() {
			if err := st.SaveSnapshot(path); err != nil {
				b.Fatal(err)
			}
		}
		if fi, err := os.Stat(path); err == nil {
			b.ReportMetric(float64(fi.Size())/100_000, "file-B/session")
		}
	})
	b.Run("restore", func(b *testing.B) {
		for b.Loop() {
			m := memstore.New(memstore.WithClock(clock.Now))
			if _, err := m.RestoreSnapshot(path); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMemdbBaselineInsert is the floor for BenchmarkCreate on this machine: one insert
// into a bare go-memdb table with only a unique string id index (reflection indexer), in a
// table of 100k rows, one write transaction per insert.
func BenchmarkMemdbBaselineInsert(b *testing.B) {
	type row struct{ ID string }
	db, err := memdb.NewMemDB(&memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		"t": {Name: "t", Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
		}},
	}})
	if err != nil {
		b.Fatal(err)
	}
	txn := db.Txn(true)
	for i := range 100_000 {
		if err := txn.Insert("t", &row{ID: benchID(i)}); err != nil {
			b.Fatal(err)
		}
	}
	txn.Commit()
	b.ReportAllocs()
	defer testutil.CPUPerOp(b)()
	i := 100_000
	for b.Loop() {
		txn := db.Txn(true)
		if err := txn.Insert("t", &row{ID: benchID(i)}); err != nil {
			b.Fatal(err)
		}
		txn.Commit()
		i++
	}
}
