package replicatest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/history"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/wire"
)

// A fault schedule: three replicas on one redis-server, each through its own fault proxy.
// Replica a holds 200 long-lived streams on instance i1 (cap 200); b and c keep asking for new
// streams on i1; clients of known sessions on i2 send short requests through every replica;
// b asks for new sessions now and then. Then the fault, for its duration, then recovery. Every
// admission and release goes to the history checker; every decision is timed.
type faultEnv struct {
	srv     *redistest.Server
	proxies map[string]*faultproxy.Proxy
	reps    []*replicatest.Replica
	// sn is the Sentinel set of a failover case (then srv is its first primary, and the
	// replicas reach Redis through the Sentinel, without fault proxies).
	sn   *redistest.Sentinel
	note string // what the fault measured of itself, for the row (set by heal)

	mu     sync.Mutex
	resets []func() // end a's streams, as Envoy resets them when a dies
	aDead  atomic.Bool
}

type faultCase struct {
	name string
	aof  bool          // redis-server with appendonly yes, appendfsync always
	dur  time.Duration // how long the fault lasts
	// inject starts the fault and returns what heals it.
	inject func(t *testing.T, e *faultEnv) (heal func())
	// degradedAll: every replica is cut off (known sessions must route on all of them for
	// outages shorter than degradedFor).
	degradedAll bool
	// sentinel runs Redis as a Sentinel set (a primary, one replica, one Sentinel with
	// down-after 3 s) that the replicas follow (store.redis.masterSet).
	sentinel bool
}

func redisDown(t *testing.T, e *faultEnv) func() {
	for _, p := range e.proxies {
		p.Cut()
	}
	return func() {
		for _, p := range e.proxies {
			p.Heal()
		}
	}
}

func redisKilled(t *testing.T, e *faultEnv) func() {
	e.srv.Kill()
	return e.srv.Restart
}

func redisPaused(t *testing.T, e *faultEnv) func() {
	e.srv.Pause()
	return e.srv.Resume
}

func killA(t *testing.T, e *faultEnv) func() {
	e.aDead.Store(true)
	e.reps[0].Crash()
	e.mu.Lock()
	resets := e.resets
	e.mu.Unlock()
	for _, r := range resets {
		r()
	}
	return func() {}
}

// sentinelFailover kills the Sentinel set's primary (kill -9): the Sentinel promotes the
// replica after down-after, and the replicas follow it. The old primary stays down for the rest
// of the fault (its host died) and comes back, empty, at heal: the Sentinel makes it the new
// primary's replica. (Restarted as soon as the promotion is seen, it raced the replicas'
// clients, which may reconnect to the address they knew before they learn the new one: an
// empty primary there took writes that were lost when it was made a replica — 60 sessions
// re-created in one run.)
func sentinelFailover(t *testing.T, e *faultEnv) func() {
	p, r := settled(t, e.sn)
	killed := time.Now()
	p.Kill()
	done := make(chan time.Duration, 1)
	go func() {
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if a, err := e.sn.PrimaryAddr(); err == nil && a == r.Addr {
				done <- time.Since(killed)
				return
			}
		}
		done <- 0
	}()
	return func() {
		promoted := <-done
		if promoted == 0 {
			t.Error("the Sentinel did not promote the replica within 2 minutes of the primary's kill -9")
		}
		p.Restart()
		e.note = fmt.Sprintf("; the Sentinel promoted the replica %v after the kill", promoted.Round(10*time.Millisecond))
	}
}

func partitionA(t *testing.T, e *faultEnv) func() {
	e.proxies["a"].Blackhole()
	return e.proxies["a"].Heal
}

type expireFunc func()

func (f expireFunc) Expire() { f() }

type faultResult struct {
	peak           map[string]int
	knownOK, known int64
	newRejected    int64 // new sessions answered 503 StoreUnavailable with Retry-After in the fault
	newOther       int64 // new sessions refused otherwise during the fault
	latencies      []time.Duration
	lost, moved    int
	sessions       int
	streamsEnded   int64
	failures       map[string]int // known-session requests refused in the fault, by code
	recreated      int64          // known sessions that came back as new ones (lost by Redis)
	slotsBack      time.Duration  // from the fault's start until b or c got a slot of i1 (0: never)
	note           string         // the fault's own measurement (faultEnv.note)
}

func runFault(t *testing.T, fc faultCase, leaseTTL, degradedFor time.Duration) faultResult {
	var opts []redistest.Option
	if fc.aof {
		opts = append(opts, redistest.WithAOF("always"))
	}
	e := &faultEnv{proxies: map[string]*faultproxy.Proxy{}}
	ro := replicatest.Options{LeaseTTL: leaseTTL, DegradedFor: degradedFor, OpTimeout: quota.CallTimeout(wire.DefaultMessageTimeout)}
	addr := ""
	if fc.sentinel {
		e.sn = redistest.StartSentinelDownAfter(t, 3*time.Second, opts...)
		e.srv, addr, ro.MasterSet = e.sn.Primary, e.sn.Sentinel.Addr, e.sn.MasterSet
		defer func() {
			if t.Failed() {
				t.Logf("sentinel log:\n%s", e.sn.Sentinel.Log())
			}
		}()
	} else {
		e.srv = redistest.Start(t, opts...)
		addr = e.srv.Addr
		for _, n := range []string{"a", "b", "c"} {
			e.proxies[n] = faultproxy.Start(t, e.srv.Addr)
		}
		ro.Addr = func(n string) string { return e.proxies[n].Addr }
	}
	svc := affinitytest.Service("fn", registry.AffinityCookie)
	svc.SessionsPerInstance = 40 // placement fills i1 first, then i2, then i3
	svc.RequestSlotsPerInstance = 200
	e.reps = replicatest.Start(t, addr, 3, []registry.Service{svc}, affinitytest.Instances("fn", 3), ro)
	a, b := e.reps[0], e.reps[1]
	h := history.New()

	var latMu sync.Mutex
	var res faultResult
	timed := func(r *replicatest.Replica, id string) (affinity.Decision, error) {
		s := time.Now()
		// As pkg/extproc decides: under the decision deadline of the message_timeout tether's
		// generated bootstrap gives Envoy.
		ctx, cancel := context.WithTimeout(context.Background(), extproc.DecisionTimeout(wire.DefaultMessageTimeout))
		d, err := r.Engine.Decide(ctx, cookieRequest(id))
		cancel()
		el := time.Since(s)
		latMu.Lock()
		res.latencies = append(res.latencies, el)
		latMu.Unlock()
		return d, err
	}
	// Sessions: one on i1 for the streams, 30 on i2 for the known-session clients (new sessions
	// of the schedule go to i2 and i3).
	created := map[string]string{}
	var onI1 string
	var onI2 []string
	for i := 0; (onI1 == "" || len(onI2) < 30) && i < 80; i++ {
		var id, inst string
		// A borrow of request slots slower than the call timeout (a loaded machine) refuses
		// one placement: try again.
		testutil.Eventually(t, "a new session placed", func() bool {
			d, err := decide(e.reps[i%3].Engine, "")
			if err != nil {
				return false
			}
			id, inst = d.SessionID(), d.Instance().ID
			d.End()
			return true
		})
		created[id] = inst
		switch {
		case inst == "i1" && onI1 == "":
			onI1 = id
		case inst == "i2" && len(onI2) < 30:
			onI2 = append(onI2, id)
		}
	}
	if onI1 == "" || len(onI2) < 30 {
		t.Fatalf("placement gave no session on i1 or too few on i2 (%d)", len(onI2))
	}
	var inFault atomic.Bool
	var faultAt time.Time
	var othersFirst atomic.Int64 // when b or c first got a slot of i1 after the fault began
	// a's 200 streams on i1, each ended (as Envoy resets it) when the engine says so.
	hold := func(r *replicatest.Replica, d affinity.Decision, ended *atomic.Int64) {
		adm := h.Admit(d.Instance().ID, r.Name)
		var once sync.Once
		end := func() {
			once.Do(func() {
				ended.Add(1)
				adm.Release()
				go d.End()
			})
		}
		d.OnExpire(expireFunc(end))
		if r == a {
			e.mu.Lock()
			e.resets = append(e.resets, end)
			e.mu.Unlock()
		} else if inFault.Load() {
			othersFirst.CompareAndSwap(0, int64(time.Since(faultAt)))
		}
		t.Cleanup(func() { once.Do(func() { adm.Release(); d.End() }) })
	}
	var aEnded, othersEnded atomic.Int64
	// b and c placed sessions on i1 and hold what is left of their leases of it until a's
	// demand makes their fair share fall: a gets all 200 within a renewal or two.
	streams := 0
	testutil.EventuallyWithin(t, 20*time.Second, "a holds 200 streams on i1", func() bool {
		for streams < 200 {
			d, err := decide(a.Engine, onI1)
			if err != nil {
				return false
			}
			hold(a, d, &aEnded)
			streams++
		}
		return true
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var known, knownOK, recreated atomic.Int64
	// warm counts the known-session clients routed through every replica at least once: the
	// fault starts only when every replica has read every known session (degraded mode routes
	// the sessions a replica knows; one it has never seen cannot be routed without Redis).
	var warm atomic.Int64
	var failMu sync.Mutex
	res.failures = map[string]int{}
	// Known-session clients on i2 through every replica in turn.
	for g, id := range onI2 {
		wg.Go(func() {
			var seen uint
			for k := g; ctx.Err() == nil; k++ {
				r := e.reps[k%3]
				if r == a && e.aDead.Load() {
					continue // a's data plane moved to the other replicas
				}
				d, err := timed(r, id)
				ok := err == nil && d.Instance().ID == "i2"
				if err == nil && d.SessionID() != id {
					// The session was lost (an empty Redis): the client keeps the new
					// cookie, as a browser does.
					id = d.SessionID()
					recreated.Add(1)
				}
				if ok && seen != 1<<len(e.reps)-1 {
					if seen |= 1 << (k % 3); seen == 1<<len(e.reps)-1 {
						warm.Add(1)
					}
				}
				if ok {
					adm := h.Admit("i2", r.Name)
					time.Sleep(time.Millisecond)
					adm.Release()
					d.End()
				} else if d != nil {
					d.End()
				}
				if inFault.Load() {
					known.Add(1)
					if ok {
						knownOK.Add(1)
					} else {
						why := "wrong instance"
						var rej *affinity.Reject
						switch {
						case errors.As(err, &rej):
							why = rej.Code
						case err != nil:
							why = err.Error()
						}
						failMu.Lock()
						res.failures[why]++
						failMu.Unlock()
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	// New streams on i1 through b and c.
	for _, r := range e.reps[1:] {
		wg.Go(func() {
			for ctx.Err() == nil {
				d, err := timed(r, onI1)
				switch {
				case err == nil && d.SessionID() != onI1:
					// Redis lost the session (an empty restart): this client's streams
					// were on it; it stops rather than open new sessions one per try.
					d.End()
					_, _ = r.Store.End(context.Background(), "fn", d.SessionID(), session.StatusTerminated, time.Now())
				case err == nil:
					hold(r, d, &othersEnded)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	// New sessions through b.
	wg.Go(func() {
		for ctx.Err() == nil {
			d, err := timed(b, "")
			var rej *affinity.Reject
			switch {
			case err == nil: // placement works; the session is ended at once (the instances' session slots are few)
				d.End()
				_, _ = b.Store.End(context.Background(), "fn", d.SessionID(), session.StatusTerminated, time.Now())
			case inFault.Load() && errors.As(err, &rej) && rej.Code == "StoreUnavailable" && rej.RetryAfter > 0:
				atomic.AddInt64(&res.newRejected, 1)
			case inFault.Load():
				atomic.AddInt64(&res.newOther, 1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	testutil.EventuallyWithin(t, time.Minute, "every known session routed through every replica", func() bool {
		return warm.Load() == int64(len(onI2))
	})
	time.Sleep(500 * time.Millisecond)
	faultAt = time.Now()
	inFault.Store(true)
	heal := fc.inject(t, e)
	time.Sleep(fc.dur)
	inFault.Store(false)
	heal()
	var lastErr error
	defer func() {
		if t.Failed() {
			t.Logf("last error placing a new session: %v", lastErr)
		}
	}()
	testutil.EventuallyWithin(t, 3*max(leaseTTL, degradedFor)+20*time.Second, "new sessions placed again after the fault", func() bool {
		d, err := decide(e.reps[2].Engine, "")
		if lastErr = err; err != nil {
			return false
		}
		d.End()
		_, _ = e.reps[2].Store.End(context.Background(), "fn", d.SessionID(), session.StatusTerminated, time.Now())
		return true
	})
	time.Sleep(500 * time.Millisecond)
	cancel()
	wg.Wait()

	peaks, err := h.CheckCap(func(string) int { return 200 })
	if err != nil {
		t.Error(err)
	}
	res.peak = map[string]int{}
	for _, p := range peaks {
		res.peak[p.Resource] = p.Max
	}
	res.streamsEnded = aEnded.Load()
	res.slotsBack = time.Duration(othersFirst.Load())
	res.known, res.knownOK, res.recreated = known.Load(), knownOK.Load(), recreated.Load()
	res.sessions = len(created)
	res.note = e.note
	rctx := context.Background()
	for id, inst := range created {
		s, err := e.reps[2].Store.Get(rctx, "fn", id)
		switch {
		case err != nil || s.Status != session.StatusActive:
			res.lost++
		case s.Instance != inst:
			res.moved++
		}
	}
	return res
}

func (r faultResult) row(name string) string {
	lat := slices.Clone(r.latencies)
	slices.Sort(lat)
	p999, worst := time.Duration(0), time.Duration(0)
	if len(lat) > 0 {
		p999, worst = lat[min(len(lat)-1, len(lat)*999/1000)], lat[len(lat)-1]
	}
	back := "never (in the run)"
	if r.slotsBack > 0 {
		back = r.slotsBack.Round(10 * time.Millisecond).String()
	}
	pct := 100.0
	if r.known > 0 {
		pct = 100 * float64(r.knownOK) / float64(r.known)
	}
	return fmt.Sprintf("| %s | i1 %d, i2 %d | %.2f%% of %d (refused: %v) | p99.9 %v, max %v | %d of %d lost, %d moved | a's streams ended %d; b/c got i1 slots after %s; known sessions re-created %d; new sessions in the fault: %d × 503 StoreUnavailable+Retry-After, %d other%s |",
		name, r.peak["i1"], r.peak["i2"], pct, r.known, r.failures, p999.Round(time.Millisecond), worst.Round(time.Millisecond),
		r.lost, r.sessions, r.moved, r.streamsEnded, back, r.recreated, r.newRejected, r.newOther, r.note)
}

// TestFaultSchedules runs the short fault schedules (a few seconds each; `make faults` runs the
// long ones with tether serve's defaults: TETHER_FAULTS=long). Under every fault: never more
// than the cap in flight (history checker), and while every replica is cut off for less than
// degradedFor, every request of a known session routes.
func TestFaultSchedules(t *testing.T) {
	long := os.Getenv("TETHER_FAULTS") == "long"
	// degradedFor 5 s: the fence is ≥ 4 s after the last renewal, far from the 1 s outages even
	// when a loaded machine delays renewals.
	leaseTTL, degradedFor := time.Second, 5*time.Second
	cases := []faultCase{
		{name: "Redis unreachable 1 s", dur: time.Second, inject: redisDown, degradedAll: true},
		{name: "redis-server killed, restarted empty after 1 s", dur: time.Second, inject: redisKilled, degradedAll: true},
		{name: "redis-server SIGSTOP 1 s", dur: time.Second, inject: redisPaused, degradedAll: true},
		{name: "replica a partitioned 7 s (> degradedFor 5 s)", dur: 7 * time.Second, inject: partitionA},
		{name: "replica a killed (kill -9)", dur: 6 * time.Second, inject: killA},
		// The fault window covers the Sentinel's down-after (3 s), its election and the
		// replicas finding the new primary. Here the failover (about 4 s) outlasts the fence
		// (degradedFor 5 s less its 1 s margin): a's streams end and known sessions get 429 until
		// the new epoch's learning window is over — degradedFor must exceed the failover time,
		// as tether serve's 15 s does (the long schedule).
		{name: "Sentinel failover (primary kill -9)", dur: 10 * time.Second, inject: sentinelFailover, degradedAll: true, sentinel: true},
	}
	if long {
		leaseTTL, degradedFor = 10*time.Second, 15*time.Second // tether serve's defaults
		cases = nil
		for _, d := range []time.Duration{1, 4, 7, 15, 60} {
			d *= time.Second
			cases = append(cases,
				faultCase{name: fmt.Sprintf("Redis unreachable %v (data kept)", d), dur: d, inject: redisDown, degradedAll: true},
				faultCase{name: fmt.Sprintf("redis-server killed %v, AOF always", d), aof: true, dur: d, inject: redisKilled, degradedAll: true},
				faultCase{name: fmt.Sprintf("redis-server killed %v, restarted empty", d), dur: d, inject: redisKilled, degradedAll: true})
		}
		cases = append(cases,
			faultCase{name: "redis-server SIGSTOP 10 s", dur: 10 * time.Second, inject: redisPaused, degradedAll: true},
			faultCase{name: "replica a partitioned 15 s", dur: 15 * time.Second, inject: partitionA},
			faultCase{name: "replica a partitioned 30 s (> degradedFor)", dur: 30 * time.Second, inject: partitionA},
			faultCase{name: "replica a killed (kill -9)", dur: 20 * time.Second, inject: killA},
			faultCase{name: "Sentinel failover (primary kill -9)", dur: 10 * time.Second, inject: sentinelFailover, degradedAll: true, sentinel: true})
	}
	var rows []string
	for _, fc := range cases {
		t.Run(fc.name, func(t *testing.T) {
			r := runFault(t, fc, leaseTTL, degradedFor)
			row := r.row(fc.name)
			rows = append(rows, row)
			t.Log(row)
			// A known session may be refused only for want of request slots its replica held
			// (never more than the lease is admitted), never because Redis is away.
			for why, n := range r.failures {
				switch {
				case !fc.degradedAll || fc.dur >= degradedFor || why == "ResourceExhausted":
				default:
					t.Errorf("%d known-session requests failed with %q during an outage shorter than degradedFor (%v)", n, why, degradedFor)
				}
			}
			if fc.degradedAll && fc.dur < degradedFor && r.streamsEnded != 0 {
				t.Errorf("%d of a's streams were ended during an outage shorter than degradedFor", r.streamsEnded)
			}
			if r.known > 0 && r.newRejected == 0 && fc.degradedAll {
				t.Errorf("no new session got 503 StoreUnavailable with Retry-After during the fault")
			}
		})
	}
	t.Logf("fault | max in flight (cap 200) | known-session success | decision latency | sessions | notes (leaseTTL %v, degradedFor %v, load %s)", leaseTTL, degradedFor, loadavg())
	for _, r := range rows {
		t.Log(r)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return string(b[:min(len(b), 14)])
}
