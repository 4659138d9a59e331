package quota_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/quota"
)

var _ balance.RequestPool = (*quota.Pool)(nil)

func client(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, Dialer: netDialer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// replica starts one replica's Leases and runs it until stop (or the test's end).
func replica(t *testing.T, addr, name string, opts ...quota.Option) (*quota.Leases, context.CancelFunc) {
	t.Helper()
	l := quota.New(client(t, addr), "q:", name, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return l, stop
}

func cap200() int { return 200 }

// TestLeasesHoldTheCapAcrossReplicas: 1000 goroutines spread over three replicas hammer one
// instance with 200 slots; never more than 200 are admitted at once, admissions go on all the
// time, and every lease is returned when the replicas stop.
func TestLeasesHoldTheCapAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	var pools []*quota.Pool
	var stops []context.CancelFunc
	for _, name := range []string{"a", "b", "c"} {
		l, stop := replica(t, srv.Addr, name)
		pools = append(pools, l.Pool("web", "i1", cap200))
		stops = append(stops, stop)
	}
	before, _ := srv.CommandCalls()
	var inside, peak, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 1000 {
		p := pools[g%3]
		wg.Go(func() {
			for range 40 {
				if !p.TryAcquire() {
					refused.Add(1)
					time.Sleep(time.Millisecond) // a client backing off after its 429
					continue
				}
				n := inside.Add(1)
				for {
					m := peak.Load()
					if n <= m || peak.CompareAndSwap(m, n) {
						break
					}
				}
				admitted.Add(1)
				time.Sleep(200 * time.Microsecond) // the request's work, holding its slot
				inside.Add(-1)
				p.Release()
			}
		})
	}
	wg.Wait()
	after, _ := srv.CommandCalls()
	t.Logf("admitted %d, refused %d, peak %d in flight; lease script calls %d for %d admissions",
		admitted.Load(), refused.Load(), peak.Load(), after["evalsha"]-before["evalsha"], admitted.Load())
	if peak.Load() > 200 {
		t.Fatalf("%d requests admitted at once over three replicas; the cap is 200", peak.Load())
	}
	if admitted.Load() < 1000 {
		t.Fatalf("only %d admissions: the replicas starved", admitted.Load())
	}
	for _, stop := range stops {
		stop()
	}
	if out, _ := srv.Do("HLEN", "q:{web}:L:i1"); out != "0" {
		t.Errorf("leases left after every replica stopped: HLEN %s", out)
	}
}

// TestDeadReplicaLeasesComeBackWithinTTL: a replica that takes every slot and dies (no return,
// no renewal) blocks the others only until its lease expires.
func TestDeadReplicaLeasesComeBackWithinTTL(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = time.Second
	dead := quota.New(client(t, srv.Addr), "q:", "dead", quota.WithTTL(ttl), quota.WithChunk(50)).Pool("web", "i1", cap200)
	for range 200 {
		if !dead.TryAcquire() {
			t.Fatal("the first replica could not take the 200 slots")
		}
	}
	died := time.Now()
	live, _ := replica(t, srv.Addr, "live", quota.WithTTL(ttl))
	p := live.Pool("web", "i1", cap200)
	if p.TryAcquire() {
		t.Fatal("a slot was admitted beyond the cap while the dead replica's lease stood")
	}
	testutil.EventuallyWithin(t, 5*ttl, "a slot after the dead replica's lease expired", p.TryAcquire)
	took := time.Since(died)
	t.Logf("slots usable again %v after the replica died (TTL %v)", took.Round(time.Millisecond), ttl)
	if took < ttl-ttl/10 {
		t.Errorf("slots came back after %v, before the TTL %v: the dead replica's lease was not honoured", took, ttl)
	}
}

// TestUnreachableRedisSpendsOnlyTheLease: with Redis gone a replica admits within the lease it
// holds, then nothing once the lease's TTL has passed; when Redis is back it borrows again.
func TestUnreachableRedisSpendsOnlyTheLease(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 2 * time.Second
	l, _ := replica(t, srv.Addr, "a", quota.WithTTL(ttl), quota.WithChunk(10))
	p := l.Pool("web", "i1", cap200)
	if !p.TryAcquire() {
		t.Fatal("first acquire failed")
	}
	lease := p.Lease()
	srv.Kill()
	n := 1
	for p.TryAcquire() {
		n++
		if n > 200 {
			break
		}
	}
	if n != lease {
		t.Errorf("admitted %d with Redis down, want exactly the lease of %d", n, lease)
	}
	for range n {
		p.Release()
	}
	testutil.EventuallyWithin(t, 3*ttl, "no admission once the lease has expired", func() bool { return !p.TryAcquire() })
	srv.Restart()
	testutil.EventuallyWithin(t, 10*time.Second, "admissions again after Redis came back", p.TryAcquire)
}
