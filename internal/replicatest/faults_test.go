package replicatest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

func decide(e *affinity.Engine, id string) (affinity.Decision, error) {
	return e.Decide(context.Background(), cookieRequest(id))
}

func newSession(t *testing.T, e *affinity.Engine) (id, instance string) {
	t.Helper()
	d, err := decide(e, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.End()
	return d.SessionID(), d.Instance().ID
}

// TestRedisUnreachable: with Redis gone, the sessions a replica knows keep routing to their
// instances (while its request leases last), new sessions get 503 StoreUnavailable with a
// retry hint, the store reports itself down; when Redis is back (its AOF replayed) everything
// recovers by itself.
//
// What the known session's requests spend with Redis down is the lease each replica holds of
// its instance, so the test makes sure there is one: each replica keeps one exchange of the
// session open across the outage (a long-lived stream), so its lease is never idle and never
// returned, and it waits on that lease before cutting Redis. The lease TTL is long enough that
// no renewal is due during the outage (the lease's validity, not an idle return or an expiry
// on a slow machine, is what is tested).
func TestRedisUnreachable(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF("always"))
	svc := benchService(50)
	reps := replicatest.Start(t, srv.Addr, 2, []registry.Service{svc}, affinitytest.Instances("fn", 3), replicatest.Options{LeaseTTL: time.Minute})
	a, b := reps[0], reps[1]
	id, inst := newSession(t, a.Engine)
	var streams []affinity.Decision
	for _, r := range reps { // both replicas route it and keep one exchange of it open
		d, err := decide(r.Engine, id)
		if err != nil || d.Instance().ID != inst {
			t.Fatalf("replica %s before the outage: %v", r.Name, err)
		}
		streams = append(streams, d)
	}
	defer func() {
		for _, d := range streams {
			d.End()
		}
	}()
	const requests = 20
	for _, r := range reps {
		if held := r.Leases.Held("fn", inst); held < 2 {
			t.Fatalf("replica %s holds a lease of %d request slots of %s with one exchange open; want room for more", r.Name, held, inst)
		}
	}

	// A session only b has seen: a cannot route it with Redis down, and says so with a 503
	// StoreUnavailable and a retry hint (not a 500).
	onlyB, _ := newSession(t, b.Engine)

	srv.Kill()
	_, err := decide(a.Engine, onlyB)
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Class != affinity.ClassNoCapacity || rej.Code != "StoreUnavailable" || rej.RetryAfter <= 0 {
		t.Errorf("a session replica a never saw, Redis down: %v; want a 503 StoreUnavailable reject with Retry-After", err)
	}
	for _, r := range reps {
		for i := range requests {
			d, err := decide(r.Engine, id)
			if err != nil {
				t.Fatalf("replica %s, request %d of a known session with Redis down (lease %d slots): %v", r.Name, i, r.Leases.Held("fn", inst), err)
			}
			if d.Instance().ID != inst {
				t.Fatalf("replica %s routed the known session to %s, want %s", r.Name, d.Instance().ID, inst)
			}
			d.End()
		}
	}
	_, err = decide(a.Engine, "")
	if !errors.As(err, &rej) || rej.Class != affinity.ClassNoCapacity || rej.Code != "StoreUnavailable" || rej.RetryAfter <= 0 {
		t.Fatalf("new session with Redis down: %v, want a 503 StoreUnavailable reject with Retry-After", err)
	}
	if a.Store.Up() || a.Store.UnavailableCount() == 0 {
		t.Errorf("store reports up=%v with %d failed calls while Redis is down", a.Store.Up(), a.Store.UnavailableCount())
	}

	srv.Restart()
	testutil.EventuallyWithin(t, 20*time.Second, "new sessions placed again after Redis came back", func() bool {
		d, err := decide(b.Engine, "")
		if err != nil {
			return false
		}
		d.End()
		return true
	})
	d, err := decide(b.Engine, id)
	if err != nil || d.Instance().ID != inst {
		t.Fatalf("the known session after recovery: %v", err)
	}
	d.End()
	if !b.Store.Up() {
		t.Error("store still reports down after recovery")
	}
}

// TestReplicaKilledUnderLoad: three replicas serve 120 sessions under load; one is killed
// (connections cut, nothing returned). No session is lost, the other replicas' clients see no
// error, and the request slots the dead replica leased are usable again within the lease TTL.
func TestReplicaKilledUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 2 * time.Second
	svc := benchService(50)
	svc.RequestSlotsPerInstance = 60
	reps := replicatest.Start(t, srv.Addr, 3, []registry.Service{svc}, affinitytest.Instances("fn", 3), replicatest.Options{LeaseTTL: ttl})
	type sess struct{ id, inst string }
	var sessions []sess
	for i := range 120 {
		id, inst := newSession(t, reps[i%3].Engine)
		sessions = append(sessions, sess{id, inst})
	}

	// Load: the requests of every session not on i1 through replicas b and c, while a is
	// killed holding every request slot of i1.
	stop := make(chan struct{})
	var errs, served atomic.Int64
	var wg sync.WaitGroup
	for g, s := range sessions {
		if s.inst == "i1" {
			continue
		}
		r := reps[1+g%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := decide(r.Engine, s.id)
				if err != nil || d.Instance().ID != s.inst {
					errs.Add(1)
					t.Errorf("session %s through replica %s: %v (instance %v, want %s)", s.id, r.Name, err, instanceOf(d), s.inst)
					return
				}
				served.Add(1)
				d.End()
				time.Sleep(time.Millisecond) // a client's think time
			}
		})
	}
	// a takes every request slot of instance i1, then dies holding them. (b and c give back
	// the i1 slots they leased while placing sessions once they have sat idle.)
	testutil.Eventually(t, "b and c hold no lease of i1", func() bool {
		return reps[1].Leases.Held("fn", "i1") == 0 && reps[2].Leases.Held("fn", "i1") == 0
	})
	var held []affinity.Decision
	for _, s := range sessions {
		if s.inst != "i1" {
			continue
		}
		for {
			d, err := decide(reps[0].Engine, s.id)
			if err != nil {
				break
			}
			held = append(held, d)
		}
		break
	}
	testutil.Eventually(t, "load running", func() bool { return served.Load() > 1000 })
	reps[0].Crash()
	died := time.Now()
	at := served.Load()
	testutil.Eventually(t, "more load after the kill", func() bool { return served.Load() > at+3000 })
	close(stop)
	wg.Wait()
	t.Logf("replica a held %d request slots of i1 when killed; %d requests served by b and c, %d errors", len(held), served.Load(), errs.Load())
	if len(held) != 60 {
		t.Errorf("replica a held %d request slots of i1, want all 60", len(held))
	}

	ctx := context.Background()
	lost := 0
	for _, s := range sessions {
		got, err := reps[1].Store.Get(ctx, "fn", s.id)
		if err != nil || got.Status != session.StatusActive || got.Instance != s.inst {
			lost++
		}
	}
	if lost != 0 {
		t.Errorf("%d of %d sessions lost when a replica was killed", lost, len(sessions))
	}
	// The dead replica's lease of i1 expires: b gets all 60 slots of i1 within the TTL.
	var onI1 string
	for _, s := range sessions {
		if s.inst == "i1" {
			onI1 = s.id
		}
	}
	var took []affinity.Decision
	testutil.EventuallyWithin(t, 3*ttl, "all 60 request slots of i1 usable on replica b", func() bool {
		for {
			d, err := decide(reps[1].Engine, onI1)
			if err != nil {
				return len(took) == 60
			}
			took = append(took, d)
		}
	})
	t.Logf("the dead replica's slots were usable again %v after the kill (lease TTL %v)", time.Since(died).Round(10*time.Millisecond), ttl)
	for _, d := range took {
		d.End()
	}
}

func instanceOf(d affinity.Decision) string {
	if d == nil {
		return "none"
	}
	return d.Instance().ID
}

// TestRedisRestartWithAOFLosesNoSession: every session acknowledged before redis-server is
// killed (SIGKILL) is there after it restarts from its append-only file (appendfsync always).
func TestRedisRestartWithAOFLosesNoSession(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF("always"))
	reps := replicatest.Start(t, srv.Addr, 1, []registry.Service{benchService(200)}, affinitytest.Instances("fn", 3), replicatest.Options{})
	var ids []string
	for range 300 {
		id, _ := newSession(t, reps[0].Engine)
		ids = append(ids, id)
	}
	srv.Kill()
	srv.Restart()
	ctx := context.Background()
	lost := 0
	testutil.EventuallyWithin(t, 20*time.Second, "Redis answering again", func() bool {
		_, _, err := reps[0].Store.List(ctx, session.Filter{Service: "fn"}, "", 1)
		return err == nil
	})
	for _, id := range ids {
		if s, err := reps[0].Store.Get(ctx, "fn", id); err != nil || s.Status != session.StatusActive {
			lost++
		}
	}
	t.Logf("sessions lost across a redis-server kill and AOF restart: %d of %d", lost, len(ids))
	if lost != 0 {
		t.Errorf("%d acknowledged sessions lost", lost)
	}
}

// TestSentinelFailover: sessions created through a Sentinel-addressed store up to the moment
// the primary is killed; after the Sentinel promotes the replica the store follows it. The
// number of acknowledged sessions lost (replication is asynchronous) is measured and logged.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a Sentinel failover")
	}
	sn := redistest.StartSentinel(t)
	st, err := redisstore.New(redisstore.Config{Addrs: []string{sn.Sentinel.Addr}, MasterSet: sn.MasterSet, KeyPrefix: "f:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	var ids []string
	for i := range 1000 {
		s := session.Session{ID: fmt.Sprintf("s%04d", i), Service: "fn", Instance: "i1", Kind: session.KindCookie, TTL: time.Hour}
		if err := st.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	before, _ := sn.PrimaryAddr()
	sn.Primary.Kill()
	start := time.Now()
	testutil.EventuallyWithin(t, 60*time.Second, "the Sentinel promoted the replica", func() bool {
		a, err := sn.PrimaryAddr()
		return err == nil && a != before
	})
	testutil.EventuallyWithin(t, 30*time.Second, "the store writes to the new primary", func() bool {
		return st.Create(ctx, session.Session{ID: "after", Service: "fn", Instance: "i1", Kind: session.KindCookie, TTL: time.Hour}) == nil
	})
	took := time.Since(start)
	lost := 0
	for _, id := range ids {
		if _, err := st.Get(ctx, "fn", id); err != nil {
			lost++
		}
	}
	t.Logf("Sentinel failover: writable again after %v; sessions lost: %d of %d acknowledged", took.Round(10*time.Millisecond), lost, len(ids))
}

// TestRedisBusyIsStoreUnavailable: while a script runs past busy-reply-threshold, Redis answers
// every other command BUSY; a new session then gets 503 StoreUnavailable with Retry-After (a
// "try again later" reply, pkg/rediserr), not a 500, and known sessions keep routing.
func TestRedisBusyIsStoreUnavailable(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--busy-reply-threshold", "50"))
	reps := replicatest.Start(t, srv.Addr, 1, []registry.Service{benchService(50)}, affinitytest.Instances("fn", 2), replicatest.Options{})
	e := reps[0].Engine
	id, inst := newSession(t, e)
	if d, err := decide(e, id); err != nil { // the replica has read it: a session it knows
		t.Fatal(err)
	} else {
		d.End()
	}
	// A script that spins for 3 s (redis-cli waits for it in the background).
	busy := exec.Command(redistest.CLIBin, "-h", "127.0.0.1", "-p", portOf(srv.Addr), "EVAL",
		"local t0 = tonumber(redis.call('TIME')[1]) while tonumber(redis.call('TIME')[1]) < t0 + 3 do end return 1", "0")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Wait() }()
	testutil.Eventually(t, "Redis answers BUSY", func() bool {
		out, _ := srv.Do("PING")
		return strings.HasPrefix(out, "BUSY")
	})
	_, err := decide(e, "")
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Code != "StoreUnavailable" || rej.RetryAfter <= 0 {
		t.Fatalf("new session while Redis is BUSY: %v, want 503 StoreUnavailable with Retry-After", err)
	}
	d, err := decide(e, id)
	if err != nil || d.Instance().ID != inst {
		t.Fatalf("known session while Redis is BUSY: %v", err)
	}
	d.End()
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
