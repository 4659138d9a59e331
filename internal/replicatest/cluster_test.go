package replicatest_test

import (
	"context"
	"fmt"
	"os"
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
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

// clusterServices returns n services like benchService (fn0…) and 3 instances of each.
func clusterServices(n, perInstance int) ([]registry.Service, []registry.Instance) {
	var svcs []registry.Service
	var insts []registry.Instance
	for i := range n {
		s := benchService(perInstance)
		s.Name = fmt.Sprint("fn", i)
		svcs = append(svcs, s)
		insts = append(insts, affinitytest.Instances(s.Name, 3)...)
	}
	return svcs, insts
}

// newSessionOf decides one new session of service svc (a request without a cookie).
func newSessionOf(e *affinity.Engine, svc string) error {
	req := cookieRequest("")
	req.Service, req.Authority = svc, svc+".example"
	d, err := e.Decide(context.Background(), req)
	if err != nil {
		return err
	}
	d.End()
	return nil
}

// recordsPerPrimary counts the session records under prefix on each of the Cluster's primaries
// (SCAN on the node itself), in the order of the primaries.
func recordsPerPrimary(t *testing.T, c *redistest.Cluster, prefix string) []int {
	t.Helper()
	prim, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range prim {
		n, cursor := 0, "0"
		for {
			res, err := p.Do("SCAN", cursor, "MATCH", prefix+"*:s:*", "COUNT", "10000")
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(res, "\n")
			cursor = strings.TrimSpace(lines[0])
			for _, l := range lines[1:] {
				if strings.TrimSpace(l) != "" {
					n++
				}
			}
			if cursor == "0" {
				break
			}
		}
		out = append(out, n)
	}
	return out
}

// newSessionRate is how many new sessions per second w goroutines get through e for services
// (round robin) within d.
func newSessionRate(e *affinity.Engine, services []string, w int, d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for g := range w {
		wg.Go(func() {
			for i := g; time.Now().Before(stop); i++ {
				if newSessionOf(e, services[i%len(services)]) == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// TestClusterLayout: where sessions live on a Redis Cluster of three primaries. Every key of a
// service carries the hash tag {service}, so a service's sessions all live on one primary, and
// only several services spread over the three (counted per primary). With TETHER_FAULTS=long
// it also measures the new-session rate of one service, and of twelve, on the Cluster against
// one redis-server, side by side in the same run (logged as ratios, not asserted).
func TestClusterLayout(t *testing.T) {
	long := os.Getenv("TETHER_FAULTS") == "long"
	c := redistest.StartCluster(t)
	svcs, insts := clusterServices(12, 1<<20)
	reps := replicatest.Start(t, "", 2, svcs, insts, replicatest.Options{Seeds: c.Addrs(), OpTimeout: 5 * time.Second})
	prefix := reps[0].Store.KeyPrefix()
	for _, s := range svcs {
		for i := range 20 {
			if err := newSessionOf(reps[i%2].Engine, s.Name); err != nil {
				t.Fatalf("new session of %s: %v", s.Name, err)
			}
		}
	}
	per := recordsPerPrimary(t, c, prefix)
	t.Logf("| 12 services × 20 sessions | session records per primary %v |", per)
	for i, n := range per {
		if n == 0 {
			t.Errorf("primary %d holds none of 12 services' sessions: %v", i, per)
		}
	}
	one := replicatest.Start(t, "", 1, svcs[:1], insts[:3], replicatest.Options{Seeds: c.Addrs(), OpTimeout: 5 * time.Second})
	for range 60 {
		if err := newSessionOf(one[0].Engine, svcs[0].Name); err != nil {
			t.Fatal(err)
		}
	}
	perOne := recordsPerPrimary(t, c, one[0].Store.KeyPrefix())
	t.Logf("| one service × 60 sessions | session records per primary %v (one hash tag: one slot) |", perOne)
	nonzero := 0
	for _, n := range perOne {
		if n > 0 {
			nonzero++
		}
	}
	if nonzero != 1 {
		t.Errorf("one service's sessions on %d primaries (%v): the layout is one service per slot", nonzero, perOne)
	}
	if !long {
		return
	}
	srv := redistest.Start(t)
	single := replicatest.Start(t, srv.Addr, 1, svcs, insts, replicatest.Options{OpTimeout: 5 * time.Second})
	names := make([]string, len(svcs))
	for i, s := range svcs {
		names[i] = s.Name
	}
	const rounds, w, d = 3, 8, 3 * time.Second
	for _, set := range [][]string{names[:1], names} {
		var onCluster, onSingle float64
		for range rounds {
			onSingle += newSessionRate(single[0].Engine, set, w, d)
			onCluster += newSessionRate(reps[0].Engine, set, w, d)
		}
		t.Logf("| new sessions/s, %d service(s), %d goroutines, %d rounds × %v | one redis-server %.0f | Cluster %.0f | Cluster/single %.2f |",
			len(set), w, rounds, d, onSingle/rounds, onCluster/rounds, onCluster/onSingle)
	}
}

// otherLoad makes new sessions of a service every 10 ms until stopped and counts the answers.
type otherLoad struct {
	ok, refused atomic.Int64
	firstErr    atomic.Pointer[error]
	stop        chan struct{}
	wg          sync.WaitGroup
}

func startOther(e *affinity.Engine, svc string) *otherLoad {
	o := &otherLoad{stop: make(chan struct{})}
	o.wg.Go(func() {
		pace := time.NewTicker(10 * time.Millisecond)
		defer pace.Stop()
		for {
			select {
			case <-o.stop:
				return
			case <-pace.C:
			}
			if err := newSessionOf(e, svc); err == nil {
				o.ok.Add(1)
			} else {
				o.refused.Add(1)
				o.firstErr.CompareAndSwap(nil, &err)
			}
		}
	})
	return o
}

func (o *otherLoad) end() (ok, refused int64) {
	close(o.stop)
	o.wg.Wait()
	return o.ok.Load(), o.refused.Load()
}

// knownLoad decides requests of known sessions every 10 ms, round robin, until stopped, and
// records the failures and the slowest decision.
type knownLoad struct {
	fails, total atomic.Int64
	slowest      atomic.Int64 // ns
	firstErr     atomic.Pointer[error]
	stop         chan struct{}
	wg           sync.WaitGroup
}

func startKnown(e *affinity.Engine, ids []string) *knownLoad {
	k := &knownLoad{stop: make(chan struct{})}
	k.wg.Go(func() {
		pace := time.NewTicker(10 * time.Millisecond)
		defer pace.Stop()
		for i := 0; ; i++ {
			select {
			case <-k.stop:
				return
			case <-pace.C:
			}
			t0 := time.Now()
			d, err := decide(e, ids[i%len(ids)])
			if took := int64(time.Since(t0)); took > k.slowest.Load() {
				k.slowest.Store(took)
			}
			k.total.Add(1)
			if err == nil && d.SessionID() != ids[i%len(ids)] {
				err = fmt.Errorf("routed as a new session %s, not the known %s", d.SessionID(), ids[i%len(ids)])
			}
			if err != nil {
				k.fails.Add(1)
				k.firstErr.CompareAndSwap(nil, &err)
			}
			if err == nil {
				d.End()
			}
		}
	})
	return k
}

func (k *knownLoad) end() {
	close(k.stop)
	k.wg.Wait()
}

// TestClusterFailoverUnderLoad: new sessions of one service (fn) from 8 goroutines through a
// replica on a Redis Cluster (three primaries, a replica each) while fn's primary fails over:
// the replica is cut off (its link killed, its reconnections refused) so that the primary takes
// writes alone for a moment, and the primary is killed (kill -9); the Cluster promotes the
// replica, and the killed
// node comes back (restarted on its nodes.conf) as the new primary's replica. With
// ackDurability replica (WAIT 1 on the key's primary) every acknowledged session is on the new
// primary after every failover; with none the loss is counted. Logged: the time from the kill
// to a Cluster that serves every slot again and to fn's first acknowledged new session after
// it, what new sessions of a service on a surviving primary got and what requests of known
// sessions of fn got (failures, slowest decision), from the kill until every slot was served
// again. make test runs one failover with replica; TETHER_FAULTS=long (make
// faults) 5 per mode.
func TestClusterFailoverUnderLoad(t *testing.T) {
	long := os.Getenv("TETHER_FAULTS") == "long"
	failovers := 1
	cases := []durabilityCase{{name: "replica", dur: redisstore.Durability{Mode: redisstore.AckReplica, Timeout: 50 * time.Millisecond}, mustKeep: true}}
	if long {
		failovers = 5
		cases = append([]durabilityCase{{name: "none", dur: redisstore.Durability{Mode: redisstore.AckNone}}}, cases...)
	}
	c := redistest.StartClusterWith(t, redistest.ClusterOptions{Replicas: 1})
	others, otherInsts := clusterServices(6, 1<<20)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// tether serve's call timeout (a quarter of the default 500 ms messageTimeout) and
			// lease settings, so that what known sessions see is what a user's replica does.
			reps := replicatest.Start(t, "", 1, append([]registry.Service{benchService(1 << 20)}, others...), append(affinitytest.Instances("fn", 3), otherInsts...),
				replicatest.Options{Durability: tc.dur, Seeds: c.Addrs(), OpTimeout: 125 * time.Millisecond, LeaseTTL: 10 * time.Second, DegradedFor: 15 * time.Second})
			prefix := reps[0].Store.KeyPrefix()
			load := startLoad(reps[0].Engine, 8)
			lost := map[string]bool{}
			var rep lossReport
			var healed, recovered time.Duration
			var otherOK, otherRefused, known, knownFails int64
			var knownSlowest time.Duration
			for i := range failovers {
				if err := c.WaitHealthy(2 * time.Minute); err != nil {
					t.Fatal(err)
				}
				p, err := c.PrimaryOf(prefix + "{fn}")
				if err != nil {
					t.Fatal(err)
				}
				r, err := c.ReplicasOf(p)
				if err != nil || len(r) != 1 {
					t.Fatalf("replicas of %s: %v, %v", p.Addr, r, err)
				}
				other := ""
				for _, s := range others {
					if q, err := c.PrimaryOf(prefix + "{" + s.Name + "}"); err == nil && q != p {
						other = s.Name
						break
					}
				}
				t.Logf("failover %d: primary %s, replica %s, %d sessions acknowledged so far", i+1, p.Addr, r[0].Addr, len(load.acknowledged()))
				load.waitFor(t, 200, false)
				// The replica is cut off: its link killed, and its reconnections refused (it now
				// authenticates as a user the primary does not know), so the primary takes writes
				// alone. (A SIGSTOPped replica, a killed link, or a replica output buffer limit lost
				// nothing: the kernel keeps what was sent to a stopped process, a replica reconnects
				// at once, and the backlog still gets through.)
				if _, err := r[0].Do("CONFIG", "SET", "masteruser", "tether-cut-off", "masterauth", "x"); err != nil {
					t.Fatal(err)
				}
				if _, err := p.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil {
					t.Fatal(err)
				}
				load.waitFor(t, 50, true) // writes on the primary alone (none: acknowledged; replica: refused)
				killed, before := time.Now(), len(load.acknowledged())
				ol := startOther(reps[0].Engine, other)
				kl := startKnown(reps[0].Engine, load.acknowledged()[:20])
				c.Kill(p)
				testutil.EventuallyWithin(t, 2*time.Minute, "the Cluster promoting the replica", func() bool {
					np, err := c.PrimaryOf(prefix + "{fn}")
					return err == nil && np == r[0]
				})
				if err := c.WaitHealthy(2 * time.Minute); err != nil {
					t.Fatal(err)
				}
				healed = max(healed, time.Since(killed))
				ok, refused := ol.end()
				if e := ol.firstErr.Load(); e != nil {
					t.Logf("failover %d: the first refusal of a new session of %s (primary alive): %v", i+1, other, *e)
				}
				otherOK, otherRefused = otherOK+ok, otherRefused+refused
				kl.end()
				if e := kl.firstErr.Load(); e != nil {
					t.Logf("failover %d: the first known-session failure: %v", i+1, *e)
				}
				known, knownFails = known+kl.total.Load(), knownFails+kl.fails.Load()
				knownSlowest = max(knownSlowest, time.Duration(kl.slowest.Load()))
				c.Restart(p) // its nodes.conf: it rejoins as the new primary's replica
				checkAfterFault(t, r[0].Addr, prefix, load, killed, lost, &rep)
				testutil.EventuallyWithin(t, 2*time.Minute, "a new session acknowledged after the failover", func() bool { return len(load.acknowledged()) > before })
				recovered = max(recovered, time.Since(killed))
			}
			load.end()
			rep.acked = len(load.acknowledged())
			t.Logf("| Cluster, %s | %s | %d creates refused | longest kill → every slot served %v, → first acknowledged create %v | a surviving primary's service meanwhile: %d created, %d refused | known sessions meanwhile: %d of %d failed, slowest %v |",
				tc.name, rep, load.fails.Load(), healed.Round(time.Millisecond), recovered.Round(time.Millisecond), otherOK, otherRefused,
				knownFails, known, knownSlowest.Round(time.Millisecond))
			if tc.mustKeep && rep.lost > 0 {
				t.Errorf("ackDurability %s lost %d acknowledged sessions over %d Cluster failovers", tc.name, rep.lost, failovers)
			}
		})
	}
}
