package replicatest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/history"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// shiftedClocks gives replica a a wall clock 30 s ahead, b one 30 s behind, c the right one.
func shiftedClocks(name string) func() time.Time {
	shift := map[string]time.Duration{"a": 30 * time.Second, "b": -30 * time.Second}[name]
	return func() time.Time { return time.Now().Add(shift) }
}

// clockSession is one client's cookie session in TestSessionsOnShiftedClocks. Times are the
// history recorder's.
type clockSession struct {
	n        int
	cookie   string
	id, inst string
	from     time.Duration // the return of the request that created it
	lastCall time.Duration // the call of its last request served (touched no earlier)
	lastRet  time.Duration // the return of its last request of any kind (touched no later)
	served   int
	gone     bool // lost and not replaced (no room)
}

// TestSessionsOnShiftedClocks: three replicas on one redis-server, a's wall clock 30 s ahead,
// b's 30 s behind, c's right. Twelve cookie sessions (idle timeout 4 s) fill every session slot
// (3 instances × 4); each is created through one replica and then touched through every
// replica in turn, once a second, then holds two streams through two replicas (4 request slots
// per instance, 8 streams asked for each), then is left alone. Redis's clock decides expiry, so:
//
//   - no session is lost early: a request whose session was replaced (a new Set-Cookie) while
//     it came less than idle − touchDelay − earlyMargin after the call of its previous request
//     is a violation;
//   - none is served late: after its last request returned, no replica may report it Active on
//     a call made later than idle + lateBound, and its session slot must be free (the counts
//     placement reads, and the instance index) on a call later than idle + touchDelay + the
//     reap interval + slotBound. The bounds absorb the error of a replica's estimate of
//     Redis's clock (one round trip) and a loaded machine; the shift they must catch is 30 s;
//   - the caps are exact: a prober asks for a new session through every replica all along
//     (no room: every slot is held), and the history checker finds no instant at which an
//     instance had more sessions certainly held (from a creation's return to the call of the
//     session's last request served) or streams certainly in flight than its caps; the
//     upstreams count the streams too.
//
// Clients are paced on the wall clock (a request every second): the gaps are what the test is
// about. Every assertion is on intervals measured from the clients' side, so a slow machine
// only makes a request late (not a violation), never a violation.
func TestSessionsOnShiftedClocks(t *testing.T) {
	if testing.Short() {
		t.Skip("about 25 s of idle timeouts")
	}
	const (
		idle       = 4 * time.Second
		touchDelay = 250 * time.Millisecond // replicatest's default
		reap       = 50 * time.Millisecond  // replicatest's reap interval
		perInst    = 4                      // session slots per instance
		reqSlots   = 4                      // request slots per instance
		gap        = time.Second
		rounds     = 9 // every session touched three times through each replica

		earlyMargin = 500 * time.Millisecond
		lateBound   = 2 * time.Second
		slotBound   = 3 * time.Second
	)
	svc := service("ck", registry.AffinityCookie)
	svc.IdleTimeout = idle
	svc.SessionsPerInstance = perInst
	svc.RequestSlotsPerInstance = reqSlots
	f := startFleetWith(t, []registry.Service{svc}, replicatest.Options{Clock: shiftedClocks})
	rec := history.New()
	ctx := context.Background()

	var mu sync.Mutex // guards violations and the history of ended holds
	var violations []string
	violate := func(format string, args ...any) {
		mu.Lock()
		violations = append(violations, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// lost handles a response that issued a new session for s's cookie: s's old session ended
	// (certainly held until the call of its last request served); early if it was still due.
	lost := func(s *clockSession, r int, call, ret time.Duration, resp *reply) {
		rec.Held("ck/"+s.inst, s.id, s.from, s.lastCall)
		if ret-s.lastCall < idle-touchDelay-earlyMargin {
			violate("session %d (%s) lost early through replica %s: replaced %v after the call of its last request served (idle timeout %v)",
				s.n, s.id, f.replicas[r].Name, (ret - s.lastCall).Round(time.Millisecond), idle)
		} else {
			t.Logf("session %d lost after a gap of %v (a slow machine): not a violation", s.n, (ret - s.lastCall).Round(time.Millisecond))
		}
		if resp.StatusCode != http.StatusOK {
			s.gone = true
			return
		}
		s.cookie = strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
		s.id = strings.TrimPrefix(s.cookie, "tether-session=")
		s.inst, s.from, s.lastCall, s.lastRet = resp.Header.Get("X-Upstream-Instance"), ret, call, ret
	}

	// Twelve sessions, created through replicas a, b, c in turn (a create the machine timed out
	// may have placed a session nobody holds: it idles out and its slot comes back).
	var sessions []*clockSession
	testutil.EventuallyWithin(t, 2*time.Minute, "12 sessions created through the three replicas", func() bool {
		n := len(sessions)
		call := rec.Now()
		resp := f.do(t, n%3, "GET", "/ck/page")
		ret := rec.Now()
		if c := resp.Header.Get("Set-Cookie"); resp.StatusCode == http.StatusOK && c != "" {
			cookie := strings.SplitN(c, ";", 2)[0]
			sessions = append(sessions, &clockSession{n: n, cookie: cookie, id: strings.TrimPrefix(cookie, "tether-session="),
				inst: resp.Header.Get("X-Upstream-Instance"), from: ret, lastCall: call, lastRet: ret})
		}
		return len(sessions) == 3*perInst
	})

	// The prober: a new session asked for through every replica in turn, all along.
	stop := make(chan struct{})
	var probes, placed atomic.Int64
	var probing sync.WaitGroup
	probing.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			resp := f.do(t, k%3, "GET", "/ck/page")
			ret := rec.Now()
			probes.Add(1)
			if resp.StatusCode == http.StatusOK && resp.Header.Get("Set-Cookie") != "" {
				placed.Add(1)
				rec.Held("ck/"+resp.Header.Get("X-Upstream-Instance"), "probe", ret, ret+time.Millisecond)
			}
		}
	})

	// Every session touched through every replica, once a second.
	var refused atomic.Int64
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			for k := range rounds {
				select {
				case <-time.After(s.lastCall + gap - rec.Now()):
				case <-stop:
					return
				}
				r := (i + k) % 3
				call := rec.Now()
				resp := f.do(t, r, "GET", "/ck/page", "Cookie", s.cookie)
				ret := rec.Now()
				s.lastRet = ret
				switch {
				case resp.Header.Get("Set-Cookie") != "":
					lost(s, r, call, ret, resp)
					if s.gone {
						return
					}
				case resp.StatusCode == http.StatusOK:
					if got := resp.Header.Get("X-Upstream-Instance"); got != s.inst {
						violate("session %d through replica %s reached %s, bound to %s", s.n, f.replicas[r].Name, got, s.inst)
					}
					s.lastCall = call
					s.served++
				default: // 429 or the machine's ext_proc timeout: not served, not lost
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()

	// Two streams per session through two replicas: 8 asked for per instance, 4 request slots.
	type open struct {
		adm    *history.Admission
		cancel context.CancelFunc
		body   func() error
	}
	var opened []open
	var streamMu sync.Mutex
	var admitted, limited atomic.Int64
	for i, s := range sessions {
		if s.gone {
			continue
		}
		for j := range 2 {
			wg.Go(func() {
				r := (i + j) % 3
				sctx, cancel := context.WithCancel(ctx)
				req, err := http.NewRequestWithContext(sctx, "GET", f.replicas[r].Harness.URL()+"/ck/stream", nil)
				if err != nil {
					cancel()
					t.Error(err)
					return
				}
				req.Header.Set("Cookie", s.cookie)
				resp, err := streamClient.Do(req)
				ret := rec.Now()
				if err != nil {
					cancel()
					t.Errorf("stream of session %d through replica %s: %v", s.n, f.replicas[r].Name, err)
					return
				}
				if resp.StatusCode != http.StatusOK {
					limited.Add(1)
					_ = resp.Body.Close()
					cancel()
					return
				}
				adm := rec.Admit("req/"+resp.Header.Get("X-Upstream-Instance"), f.replicas[r].Name)
				admitted.Add(1)
				switch {
				case resp.Header.Get("Set-Cookie") != "" && ret-s.lastCall < idle-touchDelay-earlyMargin:
					violate("session %d lost early: its stream through replica %s started a new session %v after the call of its last request served",
						s.n, f.replicas[r].Name, (ret - s.lastCall).Round(time.Millisecond))
				case resp.Header.Get("Set-Cookie") == "" && resp.Header.Get("X-Upstream-Instance") != s.inst:
					violate("the stream of session %d through replica %s reached %s, bound to %s",
						s.n, f.replicas[r].Name, resp.Header.Get("X-Upstream-Instance"), s.inst)
				}
				streamMu.Lock()
				opened = append(opened, open{adm: adm, cancel: cancel, body: resp.Body.Close})
				streamMu.Unlock()
			})
		}
	}
	wg.Wait()
	t.Logf("streams: %d admitted, %d refused (429); upstream peaks %v", admitted.Load(), limited.Load(), peaks(f))
	for _, a := range f.apps {
		if p := a.peak.Load(); p > reqSlots {
			violate("instance %s had %d requests at once; the request cap is %d", a.id, p, reqSlots)
		}
	}
	// The streams end; every session was touched until they had, and its last touch is
	// written within the touch delay.
	for _, o := range opened {
		o.adm.Release()
		o.cancel()
		_ = o.body()
	}
	testutil.EventuallyWithin(t, time.Minute, "every stream ended at the upstreams and in tether", func() bool {
		for _, a := range f.apps {
			if a.streams.Load() != 0 {
				return false
			}
		}
		for _, r := range f.replicas {
			for _, u := range mustUsage(t, r.Engine, "ck") {
				if u.Requests != 0 {
					return false
				}
			}
		}
		return true
	})
	close(stop)
	probing.Wait()
	quiet := rec.Now() // no request of any session after this
	for _, s := range sessions {
		s.lastRet = max(s.lastRet, quiet)
		if !s.gone {
			rec.Held("ck/"+s.inst, s.id, s.from, s.lastCall)
		}
	}

	// Left alone: every replica reports every session ended within the late bound, and every
	// session slot comes back within the slot bound.
	latest := -idle // the latest any replica reported a session Active, relative to lastRet + idle
	testutil.EventuallyWithin(t, 2*time.Minute, "every session reported ended by every replica", func() bool {
		done := true
		for _, s := range sessions {
			if s.gone {
				continue
			}
			for _, r := range f.replicas {
				call := rec.Now()
				got, err := r.Engine.GetSession(ctx, "ck", s.id)
				if err == nil && got.Status == session.StatusActive {
					done = false
					latest = max(latest, call-s.lastRet-idle)
					if call > s.lastRet+idle+lateBound {
						violate("session %d still Active on replica %s %v after its last request returned (idle timeout %v)",
							s.n, r.Name, (call - s.lastRet).Round(time.Millisecond), idle)
						return true // one is enough
					}
				}
			}
		}
		return done
	})
	testutil.EventuallyWithin(t, 2*time.Minute, "every session slot free", func() bool {
		call := rec.Now()
		busy := 0
		for id := range f.apps {
			list, err := f.replicas[2].Store.ActiveByInstance(ctx, "ck", id)
			if err != nil {
				t.Fatal(err)
			}
			n := f.replicas[2].Store.SessionCount(ctx, "ck", id)
			busy += len(list) + n
		}
		if busy == 0 {
			return true
		}
		if call > quiet+idle+touchDelay+reap+slotBound {
			violate("%d session slots still taken %v after the last request (idle timeout %v)", busy, (call - quiet).Round(time.Millisecond), idle)
			return true
		}
		return false
	})
	peaksOf, err := rec.CheckCap(func(res string) int {
		if strings.HasPrefix(res, "req/") {
			return reqSlots
		}
		return perInst
	})
	if err != nil {
		violate("%v", err)
	}
	served := 0
	for _, s := range sessions {
		served += s.served
	}
	most := map[string]int{}
	for _, p := range peaksOf {
		most[p.Resource] = p.Max
	}
	t.Logf("%d requests served on their sessions, %d refused (429/timeouts); prober: %d asked, %d placed; the last Active report came %v after last request + idle timeout; peaks %v",
		served, refused.Load(), probes.Load(), placed.Load(), latest.Round(time.Millisecond), most)
	for _, v := range violations {
		t.Error(v)
	}
	if served < len(sessions)*rounds/2 {
		t.Errorf("only %d of %d requests served: the test saw too little", served, len(sessions)*rounds)
	}
}

// peaks returns the most requests each upstream held at once.
func peaks(f *fleet) map[string]int64 {
	out := map[string]int64{}
	for id, a := range f.apps {
		out[id] = a.peak.Load()
	}
	return out
}
