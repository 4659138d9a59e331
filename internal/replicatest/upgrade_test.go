package replicatest_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
)

// TestRollingUpgradeFromOld: the rolling restart of TestRollingRestartOnRedis from the build
// at commit $TETHER_UPGRADE_FROM (make upgrade OLD=e11d6a0) to this tree's build: three
// replicas of the old build on one redis-server under the same load, each in turn stopped
// (SIGTERM) and started as the new build, 35 s between steps, so that both builds serve
// together for more than 60 s; then 10 s of the new build alone.
//
// What e11d6a0 promises, and so what is asserted: the cap of the capped instance is never
// exceeded across both builds (history checker; e11d6a0's lease script and this build's
// protocol-1 leases share the instance's slots), no session is lost (every request and stream
// of a known session reaches its instance with no new session, on either build), every stream
// client gets events again after each stop, and the new replicas speak protocol 1 while an
// old one is connected and 2 once none is. e11d6a0 has no drain handoff: its stop resets the
// streams it carries and fails the requests in flight on it (issue 30), so resets and failed
// requests are counted and asserted to fall only in the moments of the old replicas' stops:
// from 1 s before SIGTERM until the data plane's health check has ejected the exited replica
// (interval × unhealthy threshold + timeout, 11 s with the generated bootstrap's, plus 2 s): a
// side stream opened on the gone replica in that time fails its open, and the generated
// retry_policy picks a host again through the load balancer (no previous-hosts predicate),
// which may be the gone one again; then the client gets status_on_error (503). None may fall
// in the mixed or new-only serving.
func TestRollingUpgradeFromOld(t *testing.T) {
	from := os.Getenv("TETHER_UPGRADE_FROM")
	if from == "" {
		t.Skip("set TETHER_UPGRADE_FROM to the commit to upgrade from (make upgrade OLD=e11d6a0)")
	}
	oldBin := replicatest.BuildTetherAt(t, from)
	replicatest.BuildTether(t) // before the load: the first restart does not wait for it
	size := rollingSizeFor()
	redis := redistest.Start(t)
	apps := map[string]*app{}
	services := rollingServices(t, size, apps)
	procs := replicatest.StartProcs(t, 3, replicatest.ProcConfig{
		Bin: oldBin, E11d6a0: true,
		RedisAddr: redis.Addr, LeaseTTL: 10 * time.Second, DegradedFor: 15 * time.Second, MessageTimeout: e2e.MessageTimeout,
		Services: services,
	})
	const dwell = 35 * time.Second
	var mixedFrom, mixedTo time.Time
	var news []*replicatest.Proc
	plan := rollingPlan{
		dwell:  dwell,
		resets: true,
		restart: func(i int, old *replicatest.Proc) *replicatest.Proc {
			pc := old.Config()
			pc.Bin, pc.E11d6a0, pc.Shutdown = "", false, "{drainTimeout: 2m}"
			if i == 0 {
				mixedFrom = time.Now()
			}
			if i == len(procs)-1 {
				mixedTo = time.Now() // the last old replica has exited
			}
			np := old.RestartAs(t, pc)
			news = append(news, np)
			if i < len(procs)-1 && !strings.Contains(np.Logs(), `"protocol":1`) {
				t.Errorf("new replica %s does not speak protocol 1 with old replicas connected:\n%s", np.Name, np.Logs())
			}
			return np
		},
		after: func() {
			for _, np := range news {
				testutil.EventuallyWithin(t, time.Minute, "replica "+np.Name+" speaking protocol 2", func() bool {
					return strings.Contains(np.Logs(), `"msg":"redis protocol: speaking 2"`)
				})
			}
			time.Sleep(10 * time.Second) // the new build alone, on protocol 2
		},
	}
	res := rollingRestart(t, size, procs, apps, false, true, plan)
	res.report(t, "upgrade from "+from, size)
	mixed := mixedTo.Sub(mixedFrom)
	t.Logf("mixed versions served for %v; %d resets and %d failed requests, all at the old replicas' stops; %d probes refused on the capped instance",
		mixed.Round(100*time.Millisecond), res.resets.Load(), res.failed.Load(), res.refused.Load())
	if mixed < 60*time.Second {
		t.Errorf("mixed versions for %v, want at least 60 s", mixed)
	}
	if res.capErr != nil {
		t.Error(res.capErr)
	}
	if n := res.lost.Load(); n != 0 {
		t.Errorf("%d sessions lost (a request or stream of a known session reached another instance or got a new session): %v", n, res.Problems())
	}
	hc := envoyharness.DefaultHealthCheck()
	ejected := time.Duration(hc.UnhealthyThreshold)*hc.Interval + hc.Timeout + 2*time.Second
	var outside []string
	for _, at := range res.problemAt {
		in, last := false, -1
		for i, st := range res.stopped {
			if !at.Before(st[0].Add(-time.Second)) && !at.After(st[1].Add(ejected)) {
				in = true
			}
			if !at.Before(st[0]) {
				last = i
			}
		}
		if !in && len(outside) < 20 {
			where := "before the first stop"
			if last >= 0 {
				where = fmt.Sprintf("%v after stop %d's SIGTERM (exited after %v)", at.Sub(res.stopped[last][0]).Round(time.Millisecond), last+1,
					res.stopped[last][1].Sub(res.stopped[last][0]).Round(time.Millisecond))
			}
			outside = append(outside, where)
		}
	}
	for i, st := range res.stopped {
		t.Logf("stop %d: exited %v after SIGTERM", i+1, st[1].Sub(st[0]).Round(time.Millisecond))
	}
	if len(outside) > 0 {
		t.Errorf("problems outside the old replicas' stops (the first %d: %v): %v", len(outside), outside, res.Problems())
	}
}
