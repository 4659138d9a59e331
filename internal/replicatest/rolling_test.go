package replicatest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/history"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
)

// The rolling restart of issue 30: tether replicas restarted one at a time (SIGTERM, drain,
// exit, start again, healthy, next) under load through one Envoy-faithful data plane whose
// ext_proc cluster holds every replica, as the generated bootstrap of several replicas
// configures Envoy (health checks, round robin, the retry_policy).

// rollingSize is the load of one run.
type rollingSize struct {
	streams int // long-lived exchanges: half cookie SSE-like, half MCP Streamable GET streams
	loops   int // cookie request loops, and as many header-affinity loops
	probes  int // clients pressing on the capped service's one instance
	capped  int // that instance's request slots
}

// rollingSizeFor is the full size with TETHER_ROLLING=full (make rolling), else the make-test
// size.
func rollingSizeFor() rollingSize {
	if os.Getenv("TETHER_ROLLING") == "full" {
		return rollingSize{streams: 300, loops: 30, probes: 30, capped: 12}
	}
	return rollingSize{streams: 60, loops: 6, probes: 10, capped: 4}
}

// rollingRun is what one run measured.
type rollingRun struct {
	requests, failed, resets, streamOpens, refused atomic.Int64
	lost                                           atomic.Int64 // requests of a known session that reached another instance or got a new session
	probe503                                       atomic.Int64
	events                                         atomic.Int64
	mu                                             sync.Mutex
	problems                                       map[string]int // a message without its variable part → how often
	firstAt                                        []string
	problemAt                                      []time.Time // when each problem was seen
	// reopen: a stream client whose stream was reset or refused opens the next one (as MCP
	// clients reconnect) instead of giving up; its subscription must deliver again.
	reopen bool
}

func (r *rollingRun) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.problems == nil {
		r.problems = map[string]int{}
	}
	r.problemAt = append(r.problemAt, time.Now())
	msg := fmt.Sprintf(format, args...)
	if i := strings.Index(msg, "Set-Cookie"); i > 0 {
		msg = msg[:i+len("Set-Cookie")]
	}
	if r.problems[msg] == 0 && len(r.firstAt) < 20 {
		r.firstAt = append(r.firstAt, msg)
	}
	r.problems[msg]++
}

// Problems lists the distinct problems seen, with how often.
func (r *rollingRun) Problems() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, m := range r.firstAt {
		fmt.Fprintf(&b, "\n  %d × %s", r.problems[m], m)
	}
	return b.String()
}

// Services' maxLifetime on Redis, where a handed-off exchange's slot is held until it: the
// long streams' is longer than any run; the capped instance's short, so the test sees its
// handed-off slots come back (its probes end each stream after 20–40 s, well inside it, and
// most streams open at a drain last past its handoff).
const (
	rollingStreamLifetime = 30 * time.Minute
	rollingCappedLifetime = time.Minute
)

// rollingServices returns the services' YAML, without maxLifetime.
func rollingServices(t *testing.T, size rollingSize, apps map[string]*app) string {
	return rollingServicesWith(t, size, apps, false)
}

// rollingServicesWith returns the services' YAML; bounded sets their maxLifetime (on Redis only
// exchanges with a bound are handed off).
func rollingServicesWith(t *testing.T, size rollingSize, apps map[string]*app, bounded bool) string {
	var b strings.Builder
	svc := func(name, affinity string, n, slots int, extra string) {
		fmt.Fprintf(&b, "  - name: %s\n    match: {pathPrefix: /%s}\n    affinity: %s\n    sessionsPerInstance: 200\n    requestSlotsPerInstance: %d\n%s    instances:\n",
			name, name, affinity, slots, extra)
		for i := range n {
			a := startApp(t, fmt.Sprintf("%s-i%d", name, i+1))
			apps[a.id] = a
			in := a.instance(name)
			fmt.Fprintf(&b, "      - {id: %s, address: %s, ports: {http: %d}}\n", a.id, in.Address, in.HTTPPort)
		}
	}
	long, short := "", ""
	if bounded {
		long = "    maxLifetime: " + rollingStreamLifetime.String() + "\n"
		short = "    maxLifetime: " + rollingCappedLifetime.String() + "\n"
	}
	svc("ck", "cookie", 3, 1000, long)
	svc("hd", "header", 3, 1000, long)
	svc("mcp", "mcp-streamable", 3, 1000, "    streamsPerInstance: 1000\n"+long)
	svc("capped", "cookie", 1, size.capped, short)
	return b.String()
}

var rollingClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000, MaxConnsPerHost: 0}}

// session is one client's session: how it authenticates and where it lives.
type rollingSession struct {
	path, cookie, header, mcp, instance string
}

func (s rollingSession) request(ctx context.Context, method, url string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	if s.cookie != "" {
		req.Header.Set("Cookie", s.cookie)
	}
	if s.header != "" {
		req.Header.Set("X-Tether-Session", s.header)
	}
	if s.mcp != "" {
		req.Header.Set("Mcp-Session-Id", s.mcp)
		req.Header.Set("MCP-Protocol-Version", "2025-06-18")
	}
	return req, nil
}

// newRollingSession starts a session of service svc through the data plane.
func newRollingSession(t *testing.T, url, svc string) rollingSession {
	t.Helper()
	method := http.MethodGet
	if svc == "mcp" {
		method = http.MethodPost // initialize: the upstream answers with a fresh Mcp-Session-Id
	}
	var hdr http.Header
	// A 429 is a full instance (the capped one, its slots leased by the replicas): try again.
	testutil.EventuallyWithin(t, time.Minute, "a new "+svc+" session", func() bool {
		req, _ := http.NewRequest(method, url+"/"+svc+"/page", nil)
		if svc == "mcp" {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("MCP-Protocol-Version", "2025-06-18")
		}
		resp, err := rollingClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 && resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("new %s session: %d", svc, resp.StatusCode)
		}
		hdr = resp.Header
		return resp.StatusCode == 200
	})
	s := rollingSession{path: "/" + svc, instance: hdr.Get("X-Upstream-Instance")}
	switch svc {
	case "mcp":
		s.mcp = hdr.Get("Mcp-Session-Id")
	case "hd":
		s.header = hdr.Get("X-Tether-Session")
	default:
		s.cookie = strings.SplitN(hdr.Get("Set-Cookie"), ";", 2)[0]
	}
	if s.cookie == "" && s.header == "" && s.mcp == "" {
		t.Fatalf("new %s session: no session credential in %v", svc, hdr)
	}
	return s
}

// subscription is one long-lived stream client: it reopens its stream when it ends it
// itself (life) and records when it last got an event.
type subscription struct {
	s         rollingSession
	lastEvent atomic.Int64 // history clock, ns
}

// runStream keeps sub's stream open until ctx ends. With life the client ends each stream
// after life() and opens the next (as MCP clients reopen a GET stream the server ended);
// otherwise one stream lives until the end. Every admitted stream is a slot in rec.
func runStream(ctx context.Context, run *rollingRun, rec *history.Recorder, url string, sub *subscription, life func() time.Duration, probe bool) {
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		req, _ := sub.s.request(sctx, http.MethodGet, url+sub.s.path+"/stream")
		resp, err := rollingClient.Do(req)
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return
			}
			run.failed.Add(1)
			run.problem("stream open %s: %v", sub.s.instance, err)
			if run.reopen {
				pause(ctx)
				continue
			}
			return
		}
		if probe && resp.StatusCode == http.StatusServiceUnavailable {
			run.probe503.Add(1) // a new session on the full instance (its old one unknown): NoCapacity
		}
		if probe && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			cancel()
			run.refused.Add(1)
			continue // the capped instance is full: try again
		}
		run.streamOpens.Add(1)
		got := resp.Header.Get("X-Upstream-Instance")
		if resp.StatusCode != 200 || got != sub.s.instance {
			_ = resp.Body.Close()
			cancel()
			if resp.StatusCode == 200 {
				run.lost.Add(1)
				run.problem("stream of a session on %s reached %s", sub.s.instance, got)
			} else {
				run.failed.Add(1)
				run.problem("stream open on %s: status %d", sub.s.instance, resp.StatusCode)
			}
			if run.reopen && resp.StatusCode != 200 {
				pause(ctx)
				continue
			}
			return
		}
		adm := rec.Admit(got, "stream")
		var closing atomic.Bool
		end := func() {
			adm.Release() // before the close: it was certainly in flight until now
			closing.Store(true)
			cancel()
		}
		var timer *time.Timer
		if life != nil {
			timer = time.AfterFunc(life(), end)
		}
		stop := context.AfterFunc(ctx, end)
		br := bufio.NewReader(resp.Body)
		for {
			_, err := br.ReadString('\n')
			if err != nil {
				if !closing.Load() && ctx.Err() == nil {
					adm.Release()
					run.resets.Add(1)
					run.problem("stream on %s ended by itself: %v", got, err)
				}
				break
			}
			sub.lastEvent.Store(int64(rec.Now()))
			run.events.Add(1)
		}
		stop()
		if timer != nil {
			timer.Stop()
		}
		_ = resp.Body.Close()
		cancel()
		if !closing.Load() && ctx.Err() == nil && !run.reopen {
			return
		}
	}
}

// pause is a reconnecting client's back-off: 100 ms, or until ctx ends.
func pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
}

// runLoop sends s's requests one after the other until ctx ends: each must reach the
// session's instance without a new session. A client given a new session (lost) carries on
// with it, as a browser takes a new cookie.
func runLoop(ctx context.Context, run *rollingRun, url string, s rollingSession) {
	for ctx.Err() == nil {
		req, _ := s.request(ctx, http.MethodGet, url+s.path+"/page")
		resp, err := rollingClient.Do(req)
		if ctx.Err() != nil {
			return
		}
		run.requests.Add(1)
		if err != nil {
			run.failed.Add(1)
			run.problem("request of a session on %s: %v", s.instance, err)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		switch {
		case resp.StatusCode != 200:
			run.failed.Add(1)
			run.problem("request of a session on %s: status %d", s.instance, resp.StatusCode)
		case resp.Header.Get("X-Upstream-Instance") != s.instance || resp.Header.Get("Set-Cookie") != "" ||
			(s.header != "" && resp.Header.Get("X-Tether-Session") != "" && resp.Header.Get("X-Tether-Session") != s.header):
			run.lost.Add(1)
			run.problem("request of a session on %s: reached %s, Set-Cookie %q", s.instance, resp.Header.Get("X-Upstream-Instance"), resp.Header.Get("Set-Cookie"))
			s.instance = resp.Header.Get("X-Upstream-Instance")
			if c := resp.Header.Get("Set-Cookie"); c != "" {
				s.cookie = strings.SplitN(c, ";", 2)[0]
			}
			if v := resp.Header.Get("X-Tether-Session"); s.header != "" && v != "" {
				s.header = v
			}
		}
	}
}

// TestRollingRestartOnRedis: three tether serve processes on one redis-server behind one
// data plane; long streams (cookie and MCP Streamable) that never end, cookie and header
// request loops, and clients pressing on a capped instance; each replica in turn gets
// SIGTERM, drains and exits, starts again and becomes healthy. shutdown.handoff is on: every
// answered exchange of the draining replica is handed off to the data plane once it moved
// away (its side stream closed with OK), its request slot kept as a detached hold in Redis
// until its service's maxLifetime (pkg/quota). Asserted: no stream reset, no request failed,
// no session lost, every long stream handed off and still delivering after its replica is
// gone, the capped instance never over its cap (history checker: the handed-off probes count
// until they end, and the survivors must not lend their slots meanwhile), and the capped
// instance's handed-off slots back once their holds expired (all its slots admit again).
//
// It runs through each data plane (e2e.ForEachKind): the harness, and a real Envoy when
// ENVOY_BIN names one (make e2e-envoy; skipped otherwise), both configured from the bootstrap
// `tether bootstrap` generates for the three replicas, which is validated first either way.
func TestRollingRestartOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three tether processes and restarts each")
	}
	e2e.ForEachKind(t, rollingRestartOnRedis)
}

func rollingRestartOnRedis(t *testing.T, kind e2e.Kind) {
	size := rollingSizeFor()
	redis := redistest.Start(t)
	apps := map[string]*app{}
	services := rollingServicesWith(t, size, apps, true)
	const prefix = "roll:"
	procs := replicatest.StartProcs(t, 3, replicatest.ProcConfig{
		// tether's defaults for the leases (a stopping replica gives its leases back at once, so
		// a long TTL costs the restart nothing); message_timeout as the data plane's.
		RedisAddr: redis.Addr, KeyPrefix: prefix, LeaseTTL: 10 * time.Second, DegradedFor: 15 * time.Second, MessageTimeout: e2e.MessageTimeout,
		Services: services, Shutdown: "{drainTimeout: 2m, handoff: true}",
	})
	holds := prefix + "{capped}:D:capped-i1"
	cappedHolds := 0 // the most detached holds of the capped instance right after a replica exited
	res := rollingRestart(t, size, procs, apps, false, false, rollingPlan{kind: kind, probeLife: between(20*time.Second, 40*time.Second), onExit: func() {
		out, _ := redis.Do("ZCARD", holds)
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		cappedHolds = max(cappedHolds, n)
	}})
	res.report(t, "redis, "+string(kind), size)
	if n := res.resets.Load() + res.failed.Load() + res.lost.Load() + res.probe503.Load(); n != 0 {
		t.Errorf("rolling restart on Redis: %d resets, %d failed, %d lost: %v", res.resets.Load(), res.failed.Load(), res.lost.Load(), res.Problems())
	}
	if res.capErr != nil {
		t.Error(res.capErr)
	}
	// Every long stream was on each replica once (round robin), and was handed off then.
	if res.handedOff < size.streams || res.handoffRefused != 0 {
		t.Errorf("%d exchanges handed off, %d refused: want every one of the %d long streams handed off, none refused", res.handedOff, res.handoffRefused, size.streams)
	}
	if out, _ := redis.Do("EXISTS", prefix+"{ck}:D:ck-i1"); out != "1" {
		t.Errorf("no detached holds of the long cookie streams in Redis (EXISTS %s)", out)
	}
	ended := time.Now()
	testutil.EventuallyWithin(t, 2*time.Minute, "the capped instance's detached holds expired", func() bool {
		out, _ := redis.Do("EXISTS", holds)
		return out == "0"
	})
	t.Logf("the capped instance: up to %d detached holds right after a replica exited, gone %v after the load ended (its maxLifetime %v from each exchange's start)",
		cappedHolds, time.Since(ended).Round(100*time.Millisecond), rollingCappedLifetime)
	if n := res.holdCapped(t, size); n != size.capped {
		t.Errorf("after the holds expired the capped instance admitted %d streams at once, want its %d slots", n, size.capped)
	}
}

// TestRollingRestartOnMemdbActiveStandby: the same load on two tether serve processes with the
// memory store, active and standby (envoy.replicaMode active-standby: the standby at priority
// 1), shutdown.handoff on, the long streams never ending. The active is restarted first (the
// data plane fails over to the standby, and back once the active is healthy again), then the
// standby. Asserted: no stream reset and no request failed, and every stream keeps delivering
// after the active is gone (its side streams were handed off: closed with OK). What memdb
// loses, measured and stated: the replicas share nothing, so the standby knows none of the
// active's sessions (their requests there start new sessions, on whichever instance placement
// picks), the restarted active knows its own sessions from its snapshot but none made on the
// standby meanwhile, and the handed-off exchanges' request slots are known to no replica (an
// instance can take up to its cap more until they end). Through each data plane, as
// TestRollingRestartOnRedis (the bootstrap's envoy.replicaMode active-standby).
func TestRollingRestartOnMemdbActiveStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two tether processes and restarts each")
	}
	e2e.ForEachKind(t, rollingRestartOnMemdb)
}

func rollingRestartOnMemdb(t *testing.T, kind e2e.Kind) {
	size := rollingSizeFor()
	apps := map[string]*app{}
	services := rollingServices(t, size, apps)
	procs := replicatest.StartProcs(t, 2, replicatest.ProcConfig{
		Memory: true, Services: services, Shutdown: "{drainTimeout: 2m, handoff: true}", MessageTimeout: e2e.MessageTimeout,
	})
	res := rollingRestart(t, size, procs, apps, true, false, rollingPlan{kind: kind})
	res.report(t, "memdb active/standby, "+string(kind), size)
	if n := res.resets.Load() + res.failed.Load(); n != 0 {
		t.Errorf("rolling restart on memdb: %d resets, %d failed: %v", res.resets.Load(), res.failed.Load(), res.Problems())
	}
	t.Logf("memdb loses: %d requests of known sessions reached another instance or a new session (the replicas share nothing); cap check: %v", res.lost.Load(), res.capErr)
	for _, p := range res.peaks {
		if strings.HasPrefix(p.Resource, "capped-") && p.Max > 2*size.capped {
			t.Errorf("the capped instance had %d exchanges in flight: more than its cap %d plus the handed-off ones (at most the cap)", p.Max, size.capped)
		}
	}
}

type rollingResult struct {
	*rollingRun
	peaks   []history.Peak
	capErr  error
	took    time.Duration
	retries uint64
	stopped [][2]time.Time // per restarted replica: SIGTERM sent, exited
	// handedOff and handoffRefused sum the replicas' drains (their "ext_proc drained" logs).
	handedOff, handoffRefused int
	url                       string
	probes                    []*subscription
}

func (r rollingResult) report(t *testing.T, name string, size rollingSize) {
	t.Helper()
	var pk []string
	for _, p := range r.peaks {
		pk = append(pk, fmt.Sprintf("%s %d", p.Resource, p.Max))
	}
	t.Logf("rolling restart (%s): %d long stream clients, %d request loops ×2, %d probes on a %d-slot instance; %v for the whole restart; %d requests, %d failed, %d stream opens, %d resets, %d lost, %d probes refused (%d of them 503 NoCapacity), %d events; side stream retries %d; %d exchanges handed off, %d refused; max in flight per instance (history): %s",
		name, size.streams, size.loops, size.probes, size.capped, r.took.Round(100*time.Millisecond), r.requests.Load(), r.failed.Load(), r.streamOpens.Load(),
		r.resets.Load(), r.lost.Load(), r.refused.Load(), r.probe503.Load(), r.events.Load(), r.retries, r.handedOff, r.handoffRefused, strings.Join(pk, ", "))
}

var (
	handedOffRe      = regexp.MustCompile(`"msg":"ext_proc drained"[^\n]*"handedOff":(\d+)`)
	handoffRefusedRe = regexp.MustCompile(`"msg":"ext_proc drained"[^\n]*"handoffRefused":(\d+)`)
)

// drainCounts reads a stopped replica's drain counts from its log.
func drainCounts(logs string) (handedOff, refused int) {
	if m := handedOffRe.FindStringSubmatch(logs); m != nil {
		handedOff, _ = strconv.Atoi(m[1])
	}
	if m := handoffRefusedRe.FindStringSubmatch(logs); m != nil {
		refused, _ = strconv.Atoi(m[1])
	}
	return handedOff, refused
}

// holdCapped opens streams of the probes' sessions on the capped instance, until as many are
// admitted at once as it can take (429s tried again while the replicas' leases move), and
// returns how many it held at once: its cap when every slot came back.
func (r rollingResult) holdCapped(t *testing.T, size rollingSize) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var held atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, p := range r.probes[:size.capped] {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := p.s.request(ctx, http.MethodGet, r.url+p.s.path+"/stream")
				resp, err := rollingClient.Do(req)
				if err != nil {
					return
				}
				if resp.StatusCode != http.StatusOK {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					time.Sleep(50 * time.Millisecond)
					continue
				}
				held.Add(1)
				<-ctx.Done()
				_ = resp.Body.Close()
				return
			}
		})
	}
	_ = testutil.Poll(time.Minute, func() bool { return held.Load() >= int64(size.capped) })
	return int(held.Load())
}

// rollingPlan changes how rollingRestart restarts (a rolling upgrade: another binary, a dwell
// between steps, stops that reset streams).
type rollingPlan struct {
	// restart starts replica i again once it exited (default: the same binary and config).
	restart func(i int, old *replicatest.Proc) *replicatest.Proc
	// dwell is how long the load goes on after each restarted replica serves, but the last.
	dwell time.Duration
	// after runs once every replica was restarted, with the load still on.
	after func()
	// resets: the replicas' stops may reset streams and fail requests (a build without the
	// drain handoff); stream clients reopen, and the restart goes on.
	resets bool
	// stopped records, per restarted replica, when its SIGTERM was sent and when it exited.
	stopped [][2]time.Time
	// probeLife draws how long a probe keeps each stream (default 1–4 s).
	probeLife func() time.Duration
	// onExit runs after each replica exited, before it starts again.
	onExit func()
	// kind is the data plane in front of the replicas (default the harness): either is
	// configured from the bootstrap tether generates for the fleet (startRollingDataPlane).
	kind e2e.Kind
}

// between draws uniformly from [lo, hi).
func between(lo, hi time.Duration) func() time.Duration {
	return func() time.Duration { return lo + rand.N(hi-lo) }
}

// rollingRestart runs the load, restarts each process in turn and checks what holds in both
// backends: the cap of the capped instance (unless overCap is allowed), every subscription
// delivering after each replica is gone, each restarted replica healthy again.
func rollingRestart(t *testing.T, size rollingSize, procs []*replicatest.Proc, apps map[string]*app, standby, rotate bool, plan rollingPlan) rollingResult {
	t.Helper()
	h := startRollingDataPlane(t, plan.kind, procs, standby)
	url := h.URL()
	rec := history.New()
	run := &rollingRun{reopen: plan.resets}

	// Sessions first, then the load.
	var subs []*subscription
	for i := range size.streams {
		svc := "ck"
		if i%2 == 1 {
			svc = "mcp"
		}
		subs = append(subs, &subscription{s: newRollingSession(t, url, svc)})
	}
	var loops []rollingSession
	for range size.loops {
		loops = append(loops, newRollingSession(t, url, "ck"), newRollingSession(t, url, "hd"))
	}
	var probes []*subscription
	for range size.probes {
		probes = append(probes, &subscription{s: newRollingSession(t, url, "capped")})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { // events on every open stream
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				for _, a := range apps {
					a.nudge()
				}
			}
		}
	})
	var streamLife func() time.Duration
	if rotate {
		streamLife = between(time.Second, 4*time.Second)
	}
	probeLife := plan.probeLife
	if probeLife == nil {
		probeLife = between(time.Second, 4*time.Second)
	}
	for _, sub := range subs {
		wg.Go(func() { runStream(ctx, run, rec, url, sub, streamLife, false) })
	}
	for _, sub := range probes {
		wg.Go(func() { runStream(ctx, run, rec, url, sub, probeLife, true) })
	}
	for _, s := range loops {
		wg.Go(func() { runLoop(ctx, run, url, s) })
	}
	everyDelivered := func(what string, after time.Duration) {
		t.Helper()
		var late []string
		if !testutil.Poll(time.Minute, func() bool {
			late = late[:0]
			for _, sub := range subs {
				if time.Duration(sub.lastEvent.Load()) <= after {
					late = append(late, sub.s.path+" on "+sub.s.instance)
				}
			}
			return len(late) == 0
		}) {
			t.Fatalf("timed out waiting for %s: %d of %d silent (%v); %d resets, %d failed; problems:%s", what, len(late), len(subs), late, run.resets.Load(), run.failed.Load(), run.Problems())
		}
	}
	everyDelivered("every stream delivering", 0)
	testutil.EventuallyWithin(t, time.Minute, "the capped instance full", func() bool { return run.refused.Load() > 0 })

	start := time.Now()
	var handedOff, handoffRefused int
	for i := range procs {
		old := procs[i]
		sent := time.Now()
		if err := old.Terminate(3 * time.Minute); err != nil {
			t.Fatalf("replica %s: %v", old.Name, err)
		}
		plan.stopped = append(plan.stopped, [2]time.Time{sent, time.Now()})
		n, refused := drainCounts(old.Logs())
		handedOff, handoffRefused = handedOff+n, handoffRefused+refused
		if plan.onExit != nil {
			plan.onExit()
		}
		gone := rec.Now()
		everyDelivered(fmt.Sprintf("every stream delivering after replica %s exited", old.Name), gone)
		if plan.restart != nil {
			procs[i] = plan.restart(i, old)
		} else {
			procs[i] = old.Restart(t)
		}
		testutil.EventuallyWithin(t, time.Minute, "replica "+old.Name+" healthy again at the data plane", func() bool {
			return h.HostHealthy(procs[i].ExtProcAddr)
		})
		if !standby || i == 0 { // the data plane sends new side streams to it again
			before := h.StreamsOpenedOn(procs[i].ExtProcAddr)
			testutil.EventuallyWithin(t, time.Minute, "side streams on the restarted replica "+old.Name, func() bool {
				return h.StreamsOpenedOn(procs[i].ExtProcAddr) > before
			})
		}
		if run.failed.Load()+run.resets.Load() > 0 && !plan.resets {
			break
		}
		if i < len(procs)-1 && plan.dwell > 0 {
			time.Sleep(plan.dwell) // the load goes on: mixed replicas serve it
		}
	}
	if plan.after != nil {
		plan.after()
	}
	took := time.Since(start)
	cancel()
	wg.Wait()
	peaks, capErr := rec.CheckCap(func(res string) int {
		if strings.HasPrefix(res, "capped-") {
			return size.capped
		}
		return 1000
	})
	return rollingResult{rollingRun: run, peaks: peaks, capErr: capErr, took: took, retries: h.Retries(), stopped: plan.stopped,
		handedOff: handedOff, handoffRefused: handoffRefused, url: url, probes: probes}
}
