package replicatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// The benchmarks run the same engine work on the memdb store (the baseline) and on the Redis
// store with shared slots, side by side in one run, both on tether serve's default intervals
// and the wall clock; the Redis variants also report the Redis commands each operation cost
// (INFO commandstats on the server, before and after the timed loop, cmds/op).

func benchService(perInstance int) registry.Service {
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.SessionsPerInstance = perInstance
	svc.RequestSlotsPerInstance = 10000
	return svc
}

type engineUnderTest struct {
	name string
	eng  *affinity.Engine
	srv  *redistest.Server // nil for memdb
}

func engines(b testing.TB, perInstance int) []engineUnderTest {
	svc := benchService(perInstance)
	insts := affinitytest.Instances("fn", 10)
	// Both on the wall clock, as tether runs (the fixture's settable clock costs less than
	// time.Now and would flatter the baseline).
	mem := affinitytest.New(b, []registry.Service{svc}, insts,
		affinitytest.WithEngineOptions(affinity.WithClock(time.Now)),
		affinitytest.WithStoreOptions(memstore.WithClock(time.Now)))
	srv := redistest.Start(b)
	reps := replicatest.Start(b, srv.Addr, 1, []registry.Service{svc}, insts, replicatest.Options{Defaults: true})
	return []engineUnderTest{{"memdb", mem.Engine, nil}, {"redis", reps[0].Engine, srv}}
}

func cookieRequest(id string) affinity.Request {
	hdr := map[string][]string{}
	if id != "" {
		hdr["cookie"] = []string{"tether-session=" + id}
	}
	return affinity.Request{Protocol: affinity.ProtocolHTTP, Method: "GET", Authority: "fn.example", Path: "/", Headers: hdr}
}

func commands(b testing.TB, srv *redistest.Server) int64 {
	n, err := srv.CommandTotal("ping", "client", "client|") // connection housekeeping
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkReplicaDecideExistingSession: one request of an existing cookie session, decided
// and ended. Goal: redis ≤ 1.5× memdb, 0 Redis commands per request in the steady state.
//
// The replica's background loops (reaper lease, quota lease renewal, the touch flush of the
// one session) send Redis a few commands a second whatever the request rate. To tell them
// from the requests' own, the same wall time is then counted again with no requests:
// req-cmds/op is (commands during the loop − commands while idle) / requests, and
// idle-cmds/s is the background rate.
func BenchmarkReplicaDecideExistingSession(b *testing.B) {
	ctx := context.Background()
	for _, e := range engines(b, 200) {
		b.Run(e.name, func(b *testing.B) {
			d, err := e.eng.Decide(ctx, cookieRequest(""))
			if err != nil {
				b.Fatal(err)
			}
			id := d.SessionID()
			d.End()
			req := cookieRequest(id)
			for range 100 { // warm: the binding in the client-side cache, a request lease held
				d, err := e.eng.Decide(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				d.End()
			}
			var before int64
			if e.srv != nil {
				before = commands(b, e.srv)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d, err := e.eng.Decide(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if d.Instance().ID == "" || d.SessionID() != id {
					b.Fatalf("routed %q for session %q", d.Instance().ID, d.SessionID())
				}
				d.End()
			}
			b.StopTimer()
			if e.srv != nil {
				ran := commands(b, e.srv) - before
				elapsed := b.Elapsed()
				idleFrom := commands(b, e.srv)
				time.Sleep(elapsed) // the idle window: the same wall time without requests
				idle := commands(b, e.srv) - idleFrom
				b.ReportMetric(float64(ran)/float64(b.N), "cmds/op")
				b.ReportMetric(float64(ran-idle)/float64(b.N), "req-cmds/op")
				b.ReportMetric(float64(idle)/elapsed.Seconds(), "idle-cmds/s")
			}
		})
	}
}

// BenchmarkReplicaDecideNewSession: a request without a cookie: placement (on Redis, the
// atomic placement script) and the Set-Cookie.
func BenchmarkReplicaDecideNewSession(b *testing.B) {
	ctx := context.Background()
	for _, e := range engines(b, 1<<30) {
		b.Run(e.name, func(b *testing.B) {
			req := cookieRequest("")
			var before int64
			if e.srv != nil {
				before = commands(b, e.srv)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d, err := e.eng.Decide(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				d.End()
			}
			b.StopTimer()
			if e.srv != nil {
				b.ReportMetric(float64(commands(b, e.srv)-before)/float64(b.N), "cmds/op")
			}
		})
	}
}
