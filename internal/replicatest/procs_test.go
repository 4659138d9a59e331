package replicatest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
)

// procFleet is three tether processes on one redis-server, each with a harness data plane,
// over one cookie service "ck" with three real upstream instances.
type procFleet struct {
	redis  *redistest.Server
	procs  []*replicatest.Proc
	urls   []string
	apps   map[string]*app
	prefix string
}

func startProcFleet(t *testing.T, sessionsPerInstance, requestSlots int, ttl time.Duration) *procFleet {
	t.Helper()
	f := &procFleet{redis: redistest.Start(t), apps: map[string]*app{}, prefix: fmt.Sprintf("kill%d:", time.Now().UnixNano())}
	var insts strings.Builder
	for i := range 3 {
		a := startApp(t, fmt.Sprintf("ck-i%d", i+1))
		f.apps[a.id] = a
		in := a.instance("ck")
		fmt.Fprintf(&insts, "      - {id: %s, address: %s, ports: {http: %d}}\n", a.id, in.Address, in.HTTPPort)
	}
	f.procs = replicatest.StartProcs(t, 3, replicatest.ProcConfig{
		RedisAddr: f.redis.Addr, KeyPrefix: f.prefix, LeaseTTL: ttl,
		Services: fmt.Sprintf(`  - name: ck
    match: {pathPrefix: /ck}
    affinity: cookie
    sessionsPerInstance: %d
    requestSlotsPerInstance: %d
    instances:
%s`, sessionsPerInstance, requestSlots, insts.String()),
	})
	for _, p := range f.procs {
		f.urls = append(f.urls, p.Serve(t).URL())
	}
	return f
}

// leases returns the request-slot leases Redis records for an instance: replica → slots.
func (f *procFleet) leases(t *testing.T, instance string) map[string]string {
	t.Helper()
	out, err := f.redis.Do("HGETALL", f.prefix+"{ck}:L:"+instance)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	lines := strings.Fields(out)
	for i := 0; i+1 < len(lines); i += 2 {
		m[lines[i]] = lines[i+1]
	}
	return m
}

var procClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 500}}

// get sends one request through a data plane; err is a transport error (a reset).
func get(ctx context.Context, url, path, cookie string) (*reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
	if err != nil {
		return nil, err
	}
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := procClient.Do(req)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return &reply{StatusCode: resp.StatusCode, Header: resp.Header}, err
}

// stream is an open /stream response: lines reads its events.
type stream struct {
	resp   *http.Response
	cancel context.CancelFunc
	lines  *bufio.Reader
}

// openStream opens a long-lived /stream exchange; ok false with a nil error is a refusal
// (status in code).
func openStream(parent context.Context, url, cookie string) (s *stream, code int, err error) {
	ctx, cancel := context.WithCancel(parent)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ck/stream", nil)
	req.Header.Set("Cookie", cookie)
	resp, err := procClient.Do(req)
	if err != nil {
		cancel()
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		cancel()
		return nil, resp.StatusCode, nil
	}
	return &stream{resp: resp, cancel: cancel, lines: bufio.NewReader(resp.Body)}, 200, nil
}

func (s *stream) instance() string { return s.resp.Header.Get("X-Upstream-Instance") }

func (s *stream) close() {
	s.cancel()
	_ = s.resp.Body.Close()
}

type procSession struct {
	cookie, instance string
	home             int // the replica whose data plane created it and its client uses
}

// TestReplicaProcessKilledUnderLoad: three tether processes share one redis-server, each with
// an Envoy-faithful data plane. Under load (cookie sessions in request loops, one long-lived
// stream per session) replica a is killed with SIGKILL while it also holds every request slot
// of instance ck-i1 (its streams there). Shown:
//   - no session is lost: every session made before the kill routes to the same instance
//     through both survivors afterwards;
//   - the clients of b and c see no error at all, streams included;
//   - a's clients see what Envoy does when its ext_proc server dies (envoy.md §10): requests
//     get status_on_error (503) and open streams are reset; each retries through replica b and
//     lands on its session's instance;
//   - a's leased slots of ck-i1 come back within the lease TTL: the survivors admit up to the
//     full cap (counted at the upstream), and no more.
func TestReplicaProcessKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three tether processes")
	}
	const (
		ttl   = 2 * time.Second
		slots = 60
		perIn = 10 // sessions per instance
	)
	f := startProcFleet(t, perIn, slots, ttl) // placement fills instances in turn: perIn sessions on each
	a, b := 0, 1
	ctx := context.Background()

	var sessions []procSession
	for i := range 3 * perIn {
		r, err := get(ctx, f.urls[i%3], "/ck/page", "")
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("new session %d: %v %v", i, r, err)
		}
		sessions = append(sessions, procSession{
			cookie:   strings.SplitN(r.Header.Get("Set-Cookie"), ";", 2)[0],
			instance: r.Header.Get("X-Upstream-Instance"),
			home:     i % 3,
		})
	}
	var onI1 *procSession
	for i := range sessions {
		if sessions[i].instance == "ck-i1" {
			onI1 = &sessions[i]
			break
		}
	}
	if onI1 == nil {
		t.Fatal("no session was placed on ck-i1")
	}

	// a takes every request slot of ck-i1 with long-lived streams (once b and c have given
	// back the i1 slots they leased while placing sessions).
	testutil.Eventually(t, "only replica a may hold a lease of ck-i1", func() bool {
		for r := range f.leases(t, "ck-i1") {
			if r != f.procs[a].Replica {
				return false
			}
		}
		return true
	})
	var held []*stream
	for {
		s, code, err := openStream(ctx, f.urls[a], onI1.cookie)
		if err != nil {
			t.Fatal(err)
		}
		if s == nil {
			if code != 429 {
				t.Fatalf("a's stream %d on ck-i1: status %d, want 200 or 429", len(held), code)
			}
			break
		}
		held = append(held, s)
	}
	if len(held) != slots {
		t.Fatalf("replica a holds %d streams on ck-i1, want all %d request slots", len(held), slots)
	}

	// Load on the other instances: a request loop and a stream per session, through its home
	// replica; a's clients move to b when a fails them.
	stop := make(chan struct{})
	loadCtx, endLoad := context.WithCancel(ctx)
	defer endLoad()
	var wg sync.WaitGroup
	var served, otherErrs, aFailed, aRetried, aResets, streamsMoved atomic.Int64
	var mu sync.Mutex
	var problems []string
	problem := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	var aStreams []*atomic.Bool // per a-homed stream: reset seen and reopened through b
	for _, s := range sessions {
		if s.instance == "ck-i1" {
			continue
		}
		wg.Go(func() { // request loop
			url := f.urls[s.home]
			moved := false
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := get(loadCtx, url, "/ck/page", s.cookie)
				if loadCtx.Err() != nil {
					return
				}
				ok := err == nil && r.StatusCode == 200 && r.Header.Get("X-Upstream-Instance") == s.instance && r.Header.Get("Set-Cookie") == ""
				switch {
				case ok:
					served.Add(1)
					if moved {
						aRetried.Add(1)
						moved = false
					}
				case s.home == a && !moved && (err != nil || r.StatusCode == 503):
					aFailed.Add(1) // a is gone: retry through b, as a client of a dead replica does
					url, moved = f.urls[b], true
				default:
					otherErrs.Add(1)
					problem("session on %s (home %d, moved %v): %v %v", s.instance, s.home, moved, r, err)
					return
				}
			}
		})
		st, code, err := openStream(loadCtx, f.urls[s.home], s.cookie)
		if err != nil || st == nil || st.instance() != s.instance {
			t.Fatalf("stream of a session on %s through replica %d: %d %v", s.instance, s.home, code, err)
		}
		movedFlag := &atomic.Bool{}
		if s.home == a {
			aStreams = append(aStreams, movedFlag)
		}
		wg.Go(func() { // stream reader
			cur := st
			defer func() { cur.close() }()
			for {
				_, err := cur.lines.ReadString('\n')
				if err == nil {
					continue
				}
				select {
				case <-stop:
					return
				default:
				}
				if s.home != a || movedFlag.Load() {
					otherErrs.Add(1)
					problem("stream of a session on %s (home %d): %v", s.instance, s.home, err)
					return
				}
				aResets.Add(1)
				next, code, err := openStream(loadCtx, f.urls[b], s.cookie)
				if err != nil || next == nil || next.instance() != s.instance {
					otherErrs.Add(1)
					problem("a's stream reopened through b: %d %v (instance %v, want %s)", code, err, next, s.instance)
					return
				}
				cur.close()
				cur = next
				streamsMoved.Add(1)
				movedFlag.Store(true)
			}
		})
	}
	if !testutil.Poll(time.Minute, func() bool { return served.Load() > 300 || otherErrs.Load() > 0 }) || otherErrs.Load() > 0 {
		mu.Lock()
		t.Fatalf("load before the kill: %d served, %d errors: %v", served.Load(), otherErrs.Load(), problems)
	}

	f.procs[a].Kill()
	killed := time.Now()
	// When a's lease of ck-i1 runs out in Redis (the process can no longer renew it).
	score, err := f.redis.Do("ZSCORE", f.prefix+"{ck}:lx", "ck-i1|"+f.procs[a].Replica)
	if err != nil {
		t.Fatal(err)
	}
	var expiresMs int64
	if _, err := fmt.Sscan(score, &expiresMs); err != nil {
		t.Fatalf("a's lease of ck-i1 in Redis: %q: %v", score, err)
	}
	leaseLeft := time.UnixMilli(expiresMs).Sub(killed)
	if leaseLeft > ttl {
		t.Errorf("a's lease of ck-i1 runs out %v after the kill; the TTL is %v", leaseLeft, ttl)
	}
	before := served.Load()
	// Envoy resets a's open streams when their side streams fail; the harness notices at the
	// streams' next event, so every stream gets events until each of a's was reset.
	nudgeAll := func() {
		for _, ap := range f.apps {
			ap.nudge()
		}
	}
	testutil.EventuallyWithin(t, 20*time.Second, "every stream through a reset and reopened through b", func() bool {
		nudgeAll()
		for _, m := range aStreams {
			if !m.Load() {
				return false
			}
		}
		return true
	})
	testutil.EventuallyWithin(t, 20*time.Second, "a's streams on ck-i1 gone from the upstream", func() bool {
		nudgeAll()
		return f.apps["ck-i1"].streams.Load() == 0
	})
	for _, s := range held {
		s.close()
	}
	resetIn := time.Since(killed)

	// The survivors admit streams on ck-i1 until they hold the full cap: a's lease must expire
	// in Redis first. Each of slots clients retries until admitted; a survivor keeps some idle
	// lease (up to two chunks) that the other cannot borrow, so each client alternates
	// between b and c on every attempt, as a client spread over both would.
	var (
		probeMu         sync.Mutex
		probes          []*stream
		refusals, other atomic.Int64
		fullAt          time.Time
		pwg             sync.WaitGroup
	)
	defer func() {
		for _, s := range probes {
			s.close()
		}
	}()
	for g := range slots {
		pwg.Go(func() {
			attempt := g
			testutil.Poll(10*ttl, func() bool {
				attempt++
				s, code, err := openStream(ctx, f.urls[1+attempt%2], onI1.cookie)
				switch {
				case s != nil:
					probeMu.Lock()
					probes = append(probes, s)
					if len(probes) == slots {
						fullAt = time.Now()
					}
					probeMu.Unlock()
					return true
				case err == nil && code == 429:
					refusals.Add(1)
				default:
					other.Add(1)
				}
				return false
			})
		})
	}
	pwg.Wait()
	if len(probes) != slots || other.Load() != 0 {
		t.Fatalf("the survivors admitted %d of the %d request slots of ck-i1 (%d refusals, %d other failures); leases in Redis: %v; streams at the upstream: %d",
			len(probes), slots, refusals.Load(), other.Load(), f.leases(t, "ck-i1"), f.apps["ck-i1"].streams.Load())
	}
	regained := fullAt.Sub(killed)
	testutil.Eventually(t, "the upstream ck-i1 holds every probe stream", func() bool {
		return f.apps["ck-i1"].streams.Load() == slots
	})
	for r := 1; r <= 2; r++ {
		if s, code, err := openStream(ctx, f.urls[r], onI1.cookie); err != nil || s != nil || code != 429 {
			if s != nil {
				s.close()
			}
			t.Errorf("stream %d on ck-i1 through replica %d: %d %v, want 429 (the cap is %d)", slots+1, r, code, err, slots)
		}
	}
	if _, ok := f.leases(t, "ck-i1")[f.procs[a].Replica]; ok {
		t.Errorf("Redis still records the killed replica's lease of ck-i1: %v", f.leases(t, "ck-i1"))
	}
	testutil.Eventually(t, "more load served by b and c after the kill", func() bool { return served.Load() > before+300 })
	close(stop)
	endLoad()
	wg.Wait()
	for _, s := range probes {
		s.close()
	}
	probes = nil

	t.Logf("kill -9 of replica a (pid %d): %d requests served; a's clients: %d requests failed (503 or reset) and %d of them succeeded through b, %d streams reset and %d reopened through b; errors for b's and c's clients: %d",
		f.procs[a].Pid(), served.Load(), aFailed.Load(), aRetried.Load(), aResets.Load(), streamsMoved.Load(), otherErrs.Load())
	t.Logf("a held all %d request slots of ck-i1; its lease of ck-i1 ran out in Redis %v after the kill; its streams were reset %v after the kill; the survivors admitted the full cap again %v after the kill (lease TTL %v; %d probes refused with 429 meanwhile)",
		slots, leaseLeft.Round(10*time.Millisecond), resetIn.Round(10*time.Millisecond), regained.Round(10*time.Millisecond), ttl, refusals.Load())
	if otherErrs.Load() != 0 {
		t.Errorf("%d errors for clients of the surviving replicas: %v", otherErrs.Load(), problems)
	}
	if aFailed.Load() == 0 || aRetried.Load() != aFailed.Load() {
		t.Errorf("a's request loops: %d failed at the kill, %d succeeded through b", aFailed.Load(), aRetried.Load())
	}
	if streamsMoved.Load() != int64(len(aStreams)) {
		t.Errorf("%d of a's %d streams reopened through b", streamsMoved.Load(), len(aStreams))
	}

	// No session lost: each routes to its instance through both survivors, none re-issued.
	// (The probe streams just closed free their request slots of ck-i1 once their exchanges
	// have ended: a 429 until then is a busy instance, not a lost session.)
	testutil.Eventually(t, "the probe streams gone from ck-i1", func() bool { return f.apps["ck-i1"].streams.Load() == 0 })
	lost := 0
	for _, s := range sessions {
		for r := 1; r <= 2; r++ {
			var got *reply
			var err error
			testutil.Eventually(t, "a request of a session on "+s.instance+" admitted", func() bool {
				got, err = get(ctx, f.urls[r], "/ck/page", s.cookie)
				return err != nil || got.StatusCode != 429
			})
			if err != nil || got.StatusCode != 200 || got.Header.Get("X-Upstream-Instance") != s.instance || got.Header.Get("Set-Cookie") != "" {
				lost++
				t.Errorf("session on %s through replica %d after the kill: %v %v", s.instance, r, got, err)
				break
			}
		}
	}
	t.Logf("sessions lost: %d of %d", lost, len(sessions))
}
