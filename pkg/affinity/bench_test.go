package affinity_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

func benchFixture(b *testing.B, mode registry.AffinityMode, perInstance, n int) *affinitytest.Fixture {
	svc := affinitytest.Service("fn", mode)
	svc.SessionsPerInstance = perInstance
	svc.RequestSlotsPerInstance = 10000
	return affinitytest.New(b, []registry.Service{svc}, affinitytest.Instances("fn", n), affinitytest.WithoutRun())
}

// benchSessions is how many live sessions the existing-session benchmarks and their memdb
// baselines hold, so both look a session up in tables of the same size.
const benchSessions = 1000

// BenchmarkDecideExistingSession: one request of an existing cookie session, decided and ended,
// among benchSessions live sessions. Baselines: BenchmarkBaselineMemdbGetTouch (the goal of
// issue 15: ≤ 0.5× it, ≤ 2 allocs), BenchmarkBaselineMemdbFirst and BenchmarkBaselineStoreGetTouch.
func BenchmarkDecideExistingSession(b *testing.B) {
	f := benchFixture(b, registry.AffinityCookie, 200, 10)
	id, _ := newCookieSession(b, f, "fn")
	for range benchSessions - 1 {
		newCookieSession(b, f, "fn")
	}
	req := cookieReq("fn", id)
	decideLoop(b, f, req)
}

// BenchmarkDecideNewSession: a request without a cookie: placement, a store write, the
// Set-Cookie header. The sessions stay live (the cap is raised beyond the config's 200 so the
// instances never fill), as in a service that keeps gaining sessions.
func BenchmarkDecideNewSession(b *testing.B) {
	f := benchFixture(b, registry.AffinityCookie, 1<<30, 10)
	req := cookieReq("fn", "")
	decideLoop(b, f, req)
}

// BenchmarkDecideParallel: existing sessions (one per goroutine) decided in parallel.
func BenchmarkDecideParallel(b *testing.B) {
	f := benchFixture(b, registry.AffinityCookie, 200, 10)
	ctx := context.Background()
	ids := make(chan string, 256)
	for range 256 {
		id, _ := newCookieSession(b, f, "fn")
		ids <- id
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := cookieReq("fn", <-ids)
		for pb.Next() {
			d, err := f.Engine.Decide(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			d.End()
		}
	})
}

// BenchmarkDecideSIPHash: an initial SIP request of a hash service (parse, default key, Maglev).
func BenchmarkDecideSIPHash(b *testing.B) {
	f := benchFixture(b, registry.AffinityHash, 200, 10)
	req := affinity.Request{Service: "fn", Protocol: affinity.ProtocolSIP, Method: "INVITE",
		SIPMessage: []byte("INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bK-1\r\n" +
			"Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=abc\r\nTo: <sip:bob@example.com>\r\n" +
			"Call-ID: call-1@example.com\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n")}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := f.Engine.Decide(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		d.End()
	}
}

// BenchmarkLiveSessionMemory creates sessions through the engine (header affinity, one request
// each) and reports the heap bytes per live session. The per-instance cap is raised beyond the
// config file's 200 so that 10 instances hold them all (placement cost grows with instances,
// memory does not). Run with -benchtime=1x.
func BenchmarkLiveSessionMemory(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				svc := affinitytest.Service("fn", registry.AffinityHeader)
				svc.SessionsPerInstance = n/10 + 1
				insts := affinitytest.Instances("fn", 10)
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				f := affinitytest.New(b, []registry.Service{svc}, insts, affinitytest.WithoutRun())
				ctx := context.Background()
				for i := range n {
					d, err := f.Engine.Decide(ctx, affinitytest.HTTP("fn", "GET", "/", "x-tether-session", fmt.Sprintf("s%07d", i)))
					if err != nil {
						b.Fatal(err)
					}
					d.End()
				}
				runtime.GC()
				var after runtime.MemStats
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/session")
				runtime.KeepAlive(f)
			}
		})
	}
}

// Baselines for the ratios: the session store operations the engine's hot paths are built on,
// measured on the same kind of table.

// BenchmarkBaselineStoreGetTouch: store.Get + store.Touch of one live session, the floor under
// BenchmarkDecideExistingSession.
func BenchmarkBaselineStoreGetTouch(b *testing.B) {
	f := benchFixture(b, registry.AffinityCookie, 200, 10)
	id, _ := newCookieSession(b, f, "fn")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := f.Store.Get(ctx, "fn", id)
		if err != nil {
			b.Fatal(err)
		}
		f.Store.Touch(context.Background(), "fn", s.ID, f.Clock.Now())
	}
}

// BenchmarkBaselineStoreCreate: session.NewID + store.Create of a live session, the floor under
// BenchmarkDecideNewSession.
func BenchmarkBaselineStoreCreate(b *testing.B) {
	f := benchFixture(b, registry.AffinityCookie, 1<<30, 10)
	ctx := context.Background()
	now := f.Clock.Now()
	b.ReportAllocs()
	for b.Loop() {
		id, err := session.NewID()
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Store.Create(ctx, session.Session{ID: id, Service: "fn", Instance: "i1", Kind: session.KindCookie,
			Created: now, LastSeen: now, TTL: 6 * time.Hour, IdleTimeout: 30 * time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
}

// baselineTable returns a bare go-memdb database with one table "s" of *session.Session rows
// and only the id index memdb requires (a reflection string indexer on ID), holding n rows, and
// their ids.
func baselineTable(b *testing.B, n int) (*memdb.MemDB, []string) {
	b.Helper()
	db, err := memdb.NewMemDB(&memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		"s": {Name: "s", Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
		}},
	}})
	if err != nil {
		b.Fatal(err)
	}
	now := affinitytest.Epoch
	ids := make([]string, n)
	txn := db.Txn(true)
	for i := range ids {
		if ids[i], err = session.NewID(); err != nil {
			b.Fatal(err)
		}
		if err := txn.Insert("s", &session.Session{ID: ids[i], Service: "fn", Instance: "i1", Kind: session.KindCookie,
			Created: now, LastSeen: now, TTL: 6 * time.Hour, IdleTimeout: 30 * time.Minute, Status: session.StatusActive}); err != nil {
			b.Fatal(err)
		}
	}
	txn.Commit()
	return db, ids
}

// BenchmarkBaselineMemdbGetTouch is the baseline of issue 15's Decide goal: a bare go-memdb
// Get (a read transaction's First) and Touch (a write transaction storing a copy with LastSeen
// moved on) of one session, in a one-index table of benchSessions rows.
func BenchmarkBaselineMemdbGetTouch(b *testing.B) {
	db, ids := baselineTable(b, benchSessions)
	id := ids[0]
	now := affinitytest.Epoch
	b.ReportAllocs()
	for b.Loop() {
		raw, err := db.Txn(false).First("s", "id", id)
		if err != nil || raw == nil {
			b.Fatal(err)
		}
		now = now.Add(time.Microsecond)
		c := *raw.(*session.Session)
		c.LastSeen = now
		txn := db.Txn(true)
		if err := txn.Insert("s", &c); err != nil {
			b.Fatal(err)
		}
		txn.Commit()
	}
}

// BenchmarkBaselineMemdbFirst is the read half of BenchmarkBaselineMemdbGetTouch alone: a bare
// go-memdb read transaction's First of one session.
func BenchmarkBaselineMemdbFirst(b *testing.B) {
	db, ids := baselineTable(b, benchSessions)
	id := ids[0]
	b.ReportAllocs()
	for b.Loop() {
		if raw, err := db.Txn(false).First("s", "id", id); err != nil || raw == nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBaselineMemdbInsert is the baseline of issue 15's new-session goal (≤ 1.5× it):
// session.NewID and a one-index go-memdb insert of a session row (one write transaction each),
// into a table that grows from empty like BenchmarkDecideNewSession's store.
func BenchmarkBaselineMemdbInsert(b *testing.B) {
	db, _ := baselineTable(b, 0)
	now := affinitytest.Epoch
	b.ReportAllocs()
	for b.Loop() {
		id, err := session.NewID()
		if err != nil {
			b.Fatal(err)
		}
		txn := db.Txn(true)
		if err := txn.Insert("s", &session.Session{ID: id, Service: "fn", Instance: "i1", Kind: session.KindCookie,
			Created: now, LastSeen: now, TTL: 6 * time.Hour, IdleTimeout: 30 * time.Minute, Status: session.StatusActive}); err != nil {
			b.Fatal(err)
		}
		txn.Commit()
	}
}

// decideLoop is the timed loop of the serial Decide benchmarks: decide, answer 200, end.
func decideLoop(b *testing.B, f *affinitytest.Fixture, req affinity.Request) {
	b.Helper()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := f.Engine.Decide(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		d.OnResponse(affinity.Response{Status: 200})
		d.End()
	}
}
