package quota_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/history"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/quota"
)

var _ balance.RequestPool = (*quota.Pool)(nil)

func client(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, Dialer: netDialer(), ConnWriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// replica starts one replica's Leases on the Redis at addr and runs it until stop (or the
// test's end). Its request-path call timeout is 1 s unless opts set one: the 125 ms default is
// for Envoy's deadline, and a loaded CI machine can take longer than that for a healthy Redis,
// which would open the breaker in tests that are not about it.
func replica(t *testing.T, addr, name string, opts ...quota.Option) (*quota.Leases, context.CancelFunc) {
	t.Helper()
	l := quota.New(client(t, addr), "q:", name, append([]quota.Option{quota.WithCallTimeout(time.Second)}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return l, stop
}

// seed marks the test's fresh Redis as fresh for service web (no learning window at the start).
func seed(t *testing.T, l *quota.Leases) {
	t.Helper()
	if err := l.Seed(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
}

func cap200() int { return 200 }

// holder takes slots of a pool and holds them (long-lived streams), recording each in h, and
// plays the engine's sweeper: an exchange whose lease is past its fence is ended.
type holder struct {
	name string
	p    *quota.Pool
	h    *history.Recorder

	mu   sync.Mutex
	held []*history.Admission
}

func (x *holder) take(n int) int {
	got := 0
	for range n {
		if !x.p.TryAcquire(context.Background()) {
			break
		}
		a := x.h.Admit("i1", x.name)
		x.mu.Lock()
		x.held = append(x.held, a)
		x.mu.Unlock()
		got++
	}
	return got
}

func (x *holder) count() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.held)
}

func (x *holder) releaseAll() int {
	x.mu.Lock()
	held := x.held
	x.held = nil
	x.mu.Unlock()
	for _, a := range held {
		a.Release()
		x.p.Release()
	}
	return len(held)
}

// sweep ends the held exchanges once the pool says their lease is past its fence, as the
// engine's sweeper does, until ctx ends; it returns how many it ended.
func (x *holder) sweep(ctx context.Context) *atomic.Int64 {
	var ended atomic.Int64
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if x.p.Fenced() {
					ended.Add(int64(x.releaseAll()))
				}
			}
		}
	}()
	return &ended
}

func checkCap(t *testing.T, h *history.Recorder) int {
	t.Helper()
	peaks, err := h.CheckCap(func(string) int { return 200 })
	if err != nil {
		t.Fatal(err)
	}
	if len(peaks) == 0 {
		return 0
	}
	return peaks[0].Max
}

// TestLeasesHoldTheCapAcrossReplicas: 1000 goroutines spread over three replicas hammer one
// instance with 200 slots; never more than 200 are certainly in flight at once (the history
// checker), admissions go on all the time, and every lease is returned when the replicas stop.
func TestLeasesHoldTheCapAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	h := history.New()
	var pools []*quota.Pool
	var stops []context.CancelFunc
	for _, name := range []string{"a", "b", "c"} {
		l, stop := replica(t, srv.Addr, name)
		seed(t, l)
		pools = append(pools, l.Pool("web", "i1", cap200))
		stops = append(stops, stop)
	}
	before, _ := srv.CommandCalls()
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 1000 {
		p := pools[g%3]
		name := string(rune('a' + g%3))
		wg.Go(func() {
			for range 40 {
				if !p.TryAcquire(context.Background()) {
					refused.Add(1)
					time.Sleep(time.Millisecond) // a client backing off after its 429
					continue
				}
				a := h.Admit("i1", name)
				admitted.Add(1)
				time.Sleep(200 * time.Microsecond) // the request's work, holding its slot
				a.Release()
				p.Release()
			}
		})
	}
	wg.Wait()
	after, _ := srv.CommandCalls()
	peak := checkCap(t, h)
	t.Logf("admitted %d, refused %d, peak %d certainly in flight; lease script calls %d for %d admissions",
		admitted.Load(), refused.Load(), peak, after["evalsha"]-before["evalsha"], admitted.Load())
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

// TestDeadReplicaSlotsComeBackAfterTheHold: a replica that takes every slot and dies (no
// return, no renewal) blocks the others until Redis forgets its lease, one hold
// (max(leaseTTL, degradedFor)) after its last call — not sooner, and not much later.
func TestDeadReplicaSlotsComeBackAfterTheHold(t *testing.T) {
	srv := redistest.Start(t)
	opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(1500 * time.Millisecond), quota.WithChunk(50)}
	deadL := quota.New(client(t, srv.Addr), "q:", "dead", append([]quota.Option{quota.WithCallTimeout(time.Second)}, opts...)...)
	seed(t, deadL)
	dead := deadL.Pool("web", "i1", cap200)
	// The lease runs from its last call, sent after this instant and before the replica "dies":
	// a lower bound of when Redis may forget it (measured from after the loop, a slot can come
	// back up to that call's age before a whole hold has passed).
	died := time.Now()
	for range 200 {
		if !dead.TryAcquire(context.Background()) {
			t.Fatal("the first replica could not take the 200 slots")
		}
	}
	live, _ := replica(t, srv.Addr, "live", opts...)
	p := live.Pool("web", "i1", cap200)
	if p.TryAcquire(context.Background()) {
		t.Fatal("a slot was admitted beyond the cap while the dead replica's lease stood")
	}
	testutil.EventuallyWithin(t, 10*live.Hold(), "a slot after the dead replica's lease expired", func() bool { return p.TryAcquire(context.Background()) })
	took := time.Since(died)
	t.Logf("slots usable again %v after the replica began its last calls (hold %v = max(leaseTTL, degradedFor))", took.Round(time.Millisecond), live.Hold())
	if took < live.Hold() {
		t.Errorf("slots came back after %v, before the hold %v: the dead replica's lease was not honoured", took, live.Hold())
	}
}

// TestUnreachableRedisSpendsOnlyTheLease: with Redis gone a replica admits within the lease it
// holds — exactly that, and nothing is given back meanwhile — then nothing past its fence,
// where exchanges still in flight are told to end (Fenced). Redis comes back empty: a new
// epoch, whose learning window lends nothing new; after it the replica borrows again.
func TestUnreachableRedisSpendsOnlyTheLease(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := replica(t, srv.Addr, "a", quota.WithTTL(time.Second), quota.WithDegradedFor(2*time.Second), quota.WithChunk(10))
	seed(t, l)
	p := l.Pool("web", "i1", cap200)
	if !p.TryAcquire(context.Background()) {
		t.Fatal("first acquire failed")
	}
	lease := p.Lease()
	srv.Kill()
	start := time.Now()
	n := 1
	for p.TryAcquire(context.Background()) {
		n++
		if n > 200 {
			break
		}
	}
	if n != lease {
		t.Errorf("admitted %d with Redis down, want exactly the lease of %d", n, lease)
	}
	for range n - 1 {
		p.Release()
	}
	// One exchange stays in flight: past the fence it must be told to end.
	testutil.EventuallyWithin(t, 3*l.Hold(), "the exchange on the lapsed lease fenced", p.Fenced)
	fenced := time.Since(start)
	if p.TryAcquire(context.Background()) {
		t.Error("admitted past the fence")
	}
	if fenced >= l.Hold() {
		t.Errorf("fenced %v after Redis went away; the replica must stop before Redis may forget its lease (hold %v)", fenced, l.Hold())
	}
	t.Logf("fenced %v after the outage began (hold %v)", fenced.Round(time.Millisecond), l.Hold())
	p.Release()
	srv.Restart() // empty: no AOF
	testutil.EventuallyWithin(t, 5*l.Hold(), "admissions again after Redis came back empty and the learning window passed", func() bool { return p.TryAcquire(context.Background()) })
	if l.EpochChanges() != 1 {
		t.Errorf("epoch changes = %d after an empty restart, want 1", l.EpochChanges())
	}
}

// TestPartitionedReplicaNeverOverAdmits is issue 24's first fault with one replica cut off
// alone (a blackhole between it and Redis, longer than its degradedFor): a holds all 200
// slots with long-lived streams; b and c keep asking for new streams. While a is cut off
// nobody else gets its slots; at a's fence its streams are ended (the engine's sweeper does
// it), and only then, once Redis forgets a's lease, b and c get slots. Never more than 200 in
// flight at any instant (history checker). When the partition heals a re-registers.
func TestPartitionedReplicaNeverOverAdmits(t *testing.T) {
	srv := redistest.Start(t)
	prx := faultproxy.Start(t, srv.Addr)
	h := history.New()
	opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(2 * time.Second), quota.WithChunk(50)}
	la, _ := replica(t, prx.Addr, "a", opts...)
	seed(t, la)
	a := &holder{name: "a", p: la.Pool("web", "i1", cap200), h: h}
	if got := a.take(200); got != 200 {
		t.Fatalf("a took %d of 200 slots", got)
	}
	var others []*holder
	for _, n := range []string{"b", "c"} {
		l, _ := replica(t, srv.Addr, n, opts...)
		others = append(others, &holder{name: n, p: l.Pool("web", "i1", cap200), h: h})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := a.sweep(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, o := range others {
		wg.Go(func() {
			for ctx.Err() == nil {
				o.take(10)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	prx.Blackhole()
	cut := time.Now()
	testutil.EventuallyWithin(t, 10*la.Hold(), "b and c hold slots after a's fence", func() bool {
		return others[0].count()+others[1].count() > 0
	})
	took := time.Since(cut)
	if ended.Load() != 200 {
		t.Errorf("%d of a's 200 streams were ended at its fence", ended.Load())
	}
	prx.Heal()
	cancel()
	wg.Wait()
	t.Logf("b and c got slots %v after a was cut off (hold %v); a's streams ended: %d; b %d, c %d",
		took.Round(time.Millisecond), la.Hold(), ended.Load(), others[0].count(), others[1].count())
	peak := checkCap(t, h)
	t.Logf("peak certainly in flight: %d of 200", peak)
	// a re-registers and borrows what b and c left.
	testutil.EventuallyWithin(t, 10*la.Hold(), "a admits again after the partition healed", func() bool {
		return a.take(1) == 1 || others[0].count()+others[1].count() == 200
	})
	checkCap(t, h)
}

// TestShortOutageKeepsTheLeaseAndTheCap is issue 24's over-admission case: a holds 200 streams
// when Redis goes away for longer than leaseTTL but shorter than the hold, and comes back
// empty; b and c then ask for new streams. a keeps its streams and re-asserts them under the
// new epoch; b and c get nothing while they run. Never more than 200.
func TestShortOutageKeepsTheLeaseAndTheCap(t *testing.T) {
	srv := redistest.Start(t)
	h := history.New()
	opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(3 * time.Second), quota.WithChunk(50)}
	la, _ := replica(t, srv.Addr, "a", opts...)
	seed(t, la)
	a := &holder{name: "a", p: la.Pool("web", "i1", cap200), h: h}
	if got := a.take(200); got != 200 {
		t.Fatalf("a took %d of 200 slots", got)
	}
	var others []*holder
	for _, n := range []string{"b", "c"} {
		l, _ := replica(t, srv.Addr, n, opts...)
		others = append(others, &holder{name: n, p: l.Pool("web", "i1", cap200), h: h})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := a.sweep(ctx)
	srv.Kill()
	time.Sleep(1500 * time.Millisecond) // an outage longer than leaseTTL (1 s), shorter than the hold
	srv.Restart()                       // empty
	var wg sync.WaitGroup
	for _, o := range others {
		wg.Go(func() {
			for range 100 {
				o.take(10)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if ended.Load() != 0 {
		t.Errorf("%d of a's streams were ended during an outage shorter than degradedFor", ended.Load())
	}
	if a.count() != 200 {
		t.Errorf("a holds %d streams, want 200", a.count())
	}
	testutil.EventuallyWithin(t, 10*time.Second, "a met the new epoch", func() bool { return la.EpochChanges() == 1 })
	peak := checkCap(t, h)
	t.Logf("after a %v outage and an empty restart: a kept %d streams, b %d, c %d; peak %d of 200",
		1500*time.Millisecond, a.count(), others[0].count(), others[1].count(), peak)
	if out, _ := srv.Do("HGET", "q:{web}:L:i1", "a"); len(out) < 4 || out[:4] != "200," {
		t.Errorf("a's record after the new epoch: %q, want its 200 slots re-asserted", out)
	}
}

// TestClockOffsetChangesNothing: replicas whose wall clocks are 30 s ahead and 30 s behind
// share the cap exactly, and neither drops the other's live lease (Redis's clock decides).
func TestClockOffsetChangesNothing(t *testing.T) {
	srv := redistest.Start(t)
	h := history.New()
	ahead := func() time.Time { return time.Now().Add(30 * time.Second) }
	behind := func() time.Time { return time.Now().Add(-30 * time.Second) }
	la, _ := replica(t, srv.Addr, "ahead", quota.WithClock(ahead), quota.WithTTL(time.Second), quota.WithDegradedFor(time.Second))
	lb, _ := replica(t, srv.Addr, "behind", quota.WithClock(behind), quota.WithTTL(time.Second), quota.WithDegradedFor(time.Second))
	seed(t, la)
	a := &holder{name: "ahead", p: la.Pool("web", "i1", cap200), h: h}
	b := &holder{name: "behind", p: lb.Pool("web", "i1", cap200), h: h}
	if got := b.take(120); got != 120 {
		t.Fatalf("the replica behind took %d of 120", got)
	}
	// Several holds pass: renewals keep b's lease, and a never gets more than the rest.
	deadline := time.Now().Add(3 * la.Hold())
	for time.Now().Before(deadline) {
		a.take(200)
		time.Sleep(20 * time.Millisecond)
	}
	if a.count() != 80 || b.count() != 120 {
		t.Errorf("ahead holds %d, behind %d; want 80 and 120", a.count(), b.count())
	}
	checkCap(t, h)
}

// TestStaleEpochStopsAndReacquires: Redis loses its data while up (FLUSHALL: the epoch key is
// gone). The holder's next call meets the new epoch: it re-acquires what it still may spend
// under it, and for one hold nobody else is lent anything; then the free slots are lent again.
func TestStaleEpochStopsAndReacquires(t *testing.T) {
	srv := redistest.Start(t)
	h := history.New()
	opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(2 * time.Second), quota.WithChunk(50)}
	la, _ := replica(t, srv.Addr, "a", opts...)
	seed(t, la)
	a := &holder{name: "a", p: la.Pool("web", "i1", cap200), h: h}
	if got := a.take(150); got != 150 {
		t.Fatalf("a took %d", got)
	}
	lb, _ := replica(t, srv.Addr, "b", opts...)
	b := &holder{name: "b", p: lb.Pool("web", "i1", cap200), h: h}
	held := la.Held("web", "i1")
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 10*time.Second, "a re-acquired under the new epoch", func() bool { return la.EpochChanges() == 1 })
	if !a.p.Learning() {
		t.Error("a's pool does not report the learning window after the new epoch")
	}
	// During the window only what a re-asserted and has not in use may be lent (its idle
	// excess, when its return rounds give it back), never the 50 nobody claimed.
	if got := b.take(100); got > held-a.count() {
		t.Errorf("b was lent %d slots during the new epoch's learning window; a held %d and uses %d", got, held, a.count())
	}
	testutil.EventuallyWithin(t, 10*la.Hold(), "b lent the 50 free slots after the learning window", func() bool {
		b.take(100)
		return b.count() == 50
	})
	if a.count() != 150 {
		t.Errorf("a holds %d, want its 150", a.count())
	}
	checkCap(t, h)
}

// TestLearningLendsWhatWasGivenBack: after Redis lost its data, a re-asserts the lease it
// held (its claim on the old epoch's slots). What a then gives back of that claim is free by
// the old epoch's own cap, so b may be lent it during the learning window; nothing else, while
// Redis cannot know what replicas it has not heard from still spend. The history checker
// counts every admission of both.
func TestLearningLendsWhatWasGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	h := history.New()
	opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(time.Minute), quota.WithChunk(20)}
	la, _ := replica(t, srv.Addr, "a", opts...)
	seed(t, la)
	a := &holder{name: "a", p: la.Pool("web", "i1", cap200), h: h}
	if got := a.take(150); got != 150 {
		t.Fatalf("a took %d", got)
	}
	lb, _ := replica(t, srv.Addr, "b", opts...)
	b := &holder{name: "b", p: lb.Pool("web", "i1", cap200), h: h}
	held := la.Held("web", "i1")
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 10*time.Second, "a re-asserted its lease under the new epoch", func() bool { return la.EpochChanges() == 1 })
	// a's clients go away: its return rounds give back all but a chunk above what it uses.
	a.mu.Lock()
	for _, x := range a.held[50:] {
		x.Release()
		a.p.Release()
	}
	a.held = a.held[:50]
	a.mu.Unlock()
	testutil.EventuallyWithin(t, 10*time.Second, "a gave back its idle slots", func() bool { return la.Held("web", "i1") <= 50+20 })
	testutil.EventuallyWithin(t, 10*time.Second, "b lent slots a gave back, within the learning window", func() bool {
		b.take(200)
		return b.count() > 0
	})
	if !b.p.Learning() {
		t.Fatal("the learning window (one minute) ended before b's borrow: the test shows nothing")
	}
	for range 20 {
		b.take(200)
	}
	if max := held - la.Held("web", "i1"); b.count() > max {
		t.Errorf("b holds %d during the learning window; a claimed %d and holds %d, so at most %d are free", b.count(), held, la.Held("web", "i1"), max)
	}
	t.Logf("learning window: a claimed %d, holds %d (uses %d); b was lent %d; peak in flight %d of 200", held, la.Held("web", "i1"), a.count(), b.count(), checkCap(t, h))
}

// TestFairShareAcrossReplicas: a's clients took every slot and keep churning; b's clients then
// ask as hard. Their demands are equal, so the slots end up shared about evenly (a's target
// falls to its share and what it frees goes to b), where before a kept 200 of 200.
func TestFairShareAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	h := history.New()
	opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(time.Second)}
	la, _ := replica(t, srv.Addr, "a", opts...)
	seed(t, la)
	lb, _ := replica(t, srv.Addr, "b", opts...)
	pa, pb := la.Pool("web", "i1", cap200), lb.Pool("web", "i1", cap200)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var inA, inB atomic.Int64
	client := func(p *quota.Pool, name string, in *atomic.Int64) {
		for ctx.Err() == nil {
			if !p.TryAcquire(context.Background()) {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			adm := h.Admit("i1", name)
			in.Add(1)
			time.Sleep(20 * time.Millisecond)
			in.Add(-1)
			adm.Release()
			p.Release()
		}
	}
	for range 200 {
		wg.Go(func() { client(pa, "a", &inA) })
	}
	testutil.Eventually(t, "a uses every slot", func() bool { return inA.Load() == 200 })
	for range 200 {
		wg.Go(func() { client(pb, "b", &inB) })
	}
	testutil.EventuallyWithin(t, 30*time.Second, "b gets a fair part of the slots", func() bool { return inB.Load() >= 60 })
	t.Logf("in use when b reached its part: a %d, b %d; targets a %d, b %d", inA.Load(), inB.Load(), pa.Target(), pb.Target())
	cancel()
	wg.Wait()
	checkCap(t, h)
}

// TestHungRedisBoundsTheWait: a paused redis-server (SIGSTOP) makes the first borrow wait one
// call timeout, then the breaker is open and no request waits for Redis; admissions within
// the lease go on. At SIGCONT the queued calls run late, with Redis's clock, and nothing is
// over-admitted.
func TestHungRedisBoundsTheWait(t *testing.T) {
	srv := redistest.Start(t)
	const callTimeout = 100 * time.Millisecond
	l, _ := replica(t, srv.Addr, "a", quota.WithCallTimeout(callTimeout), quota.WithChunk(10), quota.WithDegradedFor(5*time.Second))
	seed(t, l)
	p := l.Pool("web", "i1", cap200)
	if !p.TryAcquire(context.Background()) {
		t.Fatal("first acquire failed")
	}
	lease := p.Lease()
	for range lease - 1 {
		if !p.TryAcquire(context.Background()) {
			t.Fatal("could not use the lease")
		}
	}
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	if p.TryAcquire(context.Background()) {
		t.Fatal("admitted beyond the lease with Redis hung")
	}
	first := time.Since(start)
	if !l.Degraded() {
		t.Error("the breaker is not open after a call timed out")
	}
	var worst time.Duration
	for range 100 {
		s := time.Now()
		p.TryAcquire(context.Background())
		worst = max(worst, time.Since(s))
	}
	p.Release()
	if !p.TryAcquire(context.Background()) {
		t.Error("a slot of the lease freed during the hang was not admitted")
	}
	t.Logf("first borrow against a hung Redis returned after %v (call timeout %v); the next 100 took at most %v", first, callTimeout, worst)
	// 500 ms is Envoy's message_timeout in tether's bootstrap.
	if first >= 500*time.Millisecond {
		t.Errorf("a borrow against a hung Redis took %v, past Envoy's message_timeout", first)
	}
	srv.Resume()
	testutil.EventuallyWithin(t, 10*time.Second, "Redis back: the breaker closes", func() bool { return !l.Degraded() })
}

// TestLeaseCoversTheLastSecondsPeakWhenRedisGoesAway: a replica's clients come in bursts of 40
// short exchanges, so between bursts nothing is in use. Its return rounds keep a lease for the
// burst (the most in use at once over the last second), not for what a round happens to find
// in use: when Redis goes away (kill -9) the lease it holds admits every burst of the outage.
// Before, a round between bursts cut the lease to one chunk (16), and the outage refused the
// rest of every burst with 429 although the instance had 160 slots free.
func TestLeaseCoversTheLastSecondsPeakWhenRedisGoesAway(t *testing.T) {
	srv := redistest.Start(t)
	la, _ := replica(t, srv.Addr, "a", quota.WithTTL(time.Second), quota.WithDegradedFor(10*time.Second))
	seed(t, la)
	p := la.Pool("web", "i1", cap200)
	ctx := context.Background()
	const burst = 40
	bursts := func(d time.Duration) (refused int) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			got := 0
			for range burst {
				if p.TryAcquire(ctx) {
					got++
				}
			}
			for range got {
				p.Release()
			}
			refused += burst - got
		}
		return refused
	}
	bursts(1500 * time.Millisecond) // six return rounds with Redis: the lease follows the bursts
	srv.Kill()
	if refused := bursts(1500 * time.Millisecond); refused > 0 {
		t.Errorf("%d acquisitions of bursts of %d refused while Redis was away (lease %d); want none: the bursts were the demand of the last second", refused, burst, p.Lease())
	}
}
