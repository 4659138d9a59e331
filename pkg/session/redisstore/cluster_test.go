package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// servicesOn returns per service names whose keys (under prefix) live on each of the Cluster's
// primaries, per of them on each, and the primary of each.
func servicesOn(t *testing.T, c *redistest.Cluster, prefix string, per int) ([]string, map[string]*redistest.Server) {
	t.Helper()
	prim, err := c.Primaries()
	if err != nil || len(prim) != 3 {
		t.Fatalf("primaries: %v, %v", prim, err)
	}
	onEach := map[*redistest.Server]int{}
	var names []string
	owner := map[string]*redistest.Server{}
	for i := 0; len(names) < per*len(prim); i++ {
		name := fmt.Sprint("svc", i)
		p, err := c.PrimaryOf(prefix + "{" + name + "}")
		if err != nil {
			t.Fatal(err)
		}
		if onEach[p] < per {
			onEach[p]++
			names = append(names, name)
			owner[name] = p
		}
	}
	return names, owner
}

// TestRedisStoreOnCluster: two handles (two replicas) on a Redis Cluster of three primaries
// with a replica each, ackDurability replica, over services whose keys live on every primary:
// placements keep every instance's cap exact, each handle reads the other's sessions and hears
// its ends (pub/sub across nodes), and every acknowledged write was waited for on its key's
// primary — also when the key's slot moved to another node since the client last looked (the
// case rueidis's Cluster DoMulti got wrong). Then a primary is killed: its replica takes over
// with every acknowledged session, new sessions of its services get 503 StoreUnavailable until
// a replica acknowledges again (the killed node back, now the replica), and the others' never
// stop.
func TestRedisStoreOnCluster(t *testing.T) {
	c := redistest.StartClusterWith(t, redistest.ClusterOptions{Replicas: 1})
	clock := testutil.NewClock(sessiontest.Start())
	cfg := redisstore.Config{Addrs: c.Addrs(), KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	dur := redisstore.WithDurability(redisstore.Durability{Mode: redisstore.AckReplica, Timeout: 200 * time.Millisecond})
	a := runRedisStore(t, cfg, clock, dur, redisstore.WithOpTimeout(10*time.Second))
	b := runRedisStore(t, cfg, clock, dur, redisstore.WithOpTimeout(10*time.Second))
	if a.Client().Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %v, want cluster", a.Client().Mode())
	}
	services, owner := servicesOn(t, c, cfg.KeyPrefix, 2)
	ctx := context.Background()
	testutil.EventuallyWithin(t, time.Minute, "creates acknowledged on every primary (each streaming to its replica)", func() bool {
		for _, svc := range services {
			s := sessiontest.Session(svc, "warm"+sessiontest.RandomHex(t, 4), "x")
			if a.Create(ctx, s) != nil {
				return false
			}
		}
		return true
	})

	t.Run("caps exact over services on every primary", func(t *testing.T) {
		checkClusterPlacements(t, a, b, services, clock)
	})
	t.Run("acknowledged on the key's primary after its slot moved", func(t *testing.T) {
		checkAckAfterSlotMove(t, c, a, cfg.KeyPrefix, services, owner)
	})
	if err := c.WaitHealthy(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Run("a new service while the service list's node is stopped", func(t *testing.T) {
		checkServiceListNodeDown(t, c, runRedisStore(t, cfg, clock, redisstore.WithOpTimeout(time.Second)), cfg.KeyPrefix)
	})
	if err := c.WaitHealthy(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Run("primary killed", func(t *testing.T) {
		checkClusterFailover(t, c, a, cfg.KeyPrefix, services, owner)
	})
}

// checkClusterPlacements: 40 concurrent placements per service through two handles onto 3
// instances of 5 slots: exactly 15 placed per service; the other handle reads each; half are
// ended through it and the first hears every end; the counts follow.
func checkClusterPlacements(t *testing.T, a, b *redisstore.Store, services []string, clock *testutil.Clock) {
	ctx := context.Background()
	cands := []session.PlaceCandidate{{Instance: "i1", Cap: 5}, {Instance: "i2", Cap: 5}, {Instance: "i3", Cap: 5}}
	var heard atomic.Int64
	a.SetEndHandler(func(ev session.EndEvent) {
		if !ev.Local {
			heard.Add(1)
		}
	})
	defer a.SetEndHandler(nil)
	placed := map[string]map[string]string{} // service → id → instance
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, svc := range services {
		placed[svc] = map[string]string{}
		for g := range 40 {
			wg.Go(func() {
				h := []*redisstore.Store{a, b}[g%2]
				id := fmt.Sprintf("p%02d", g)
				inst, _, err := h.PlaceCreate(ctx, sessiontest.Session(svc, id, "x"), cands)
				switch {
				case err == nil:
					mu.Lock()
					placed[svc][id] = inst
					mu.Unlock()
				case !errors.Is(err, session.ErrNoRoom):
					t.Errorf("PlaceCreate %s/%s: %v", svc, id, err)
				}
			})
		}
	}
	wg.Wait()
	ended := 0
	for _, svc := range services {
		sessiontest.Diff(t, "sessions placed on "+svc, 15, len(placed[svc]))
		for _, cand := range cands {
			sessiontest.Diff(t, "count of "+svc+"/"+cand.Instance, 5, b.SessionCount(ctx, svc, cand.Instance))
		}
		for id, inst := range placed[svc] {
			s, err := b.Get(ctx, svc, id)
			if err != nil || s.Instance != inst {
				t.Errorf("Get %s/%s through the other handle: %+v, %v; want on %s", svc, id, s, err, inst)
			}
			if id < "p20" {
				if _, err := b.End(ctx, svc, id, session.StatusTerminated, clock.Now()); err != nil {
					t.Errorf("End %s/%s: %v", svc, id, err)
				}
				ended++
			}
		}
	}
	testutil.Eventually(t, "the first handle hearing every end the second made", func() bool { return heard.Load() == int64(ended) })
	for _, svc := range services {
		n := 0
		for _, cand := range cands {
			n += a.SessionCount(ctx, svc, cand.Instance)
		}
		left := 0
		for id := range placed[svc] {
			if id >= "p20" {
				left++
			}
		}
		sessiontest.Diff(t, "slots held on "+svc+" after the ends", left, n)
	}
}

// checkAckAfterSlotMove: the slot of a new service moves (CLUSTER SETSLOT … NODE) from its
// primary P to another primary Q whose replica is stopped, behind the client's back. A create
// must not be acknowledged: its write goes to Q (MOVED), whose replica does not have it. Once
// Q's replica runs again, creates are acknowledged and Q's replica has each at once.
func checkAckAfterSlotMove(t *testing.T, c *redistest.Cluster, st *redisstore.Store, prefix string, services []string, owner map[string]*redistest.Server) {
	const svc = "moved"
	key := prefix + "{" + svc + "}"
	p, err := c.PrimaryOf(key)
	if err != nil {
		t.Fatal(err)
	}
	var q *redistest.Server
	for _, s := range services {
		if owner[s] != p {
			q = owner[s]
			break
		}
	}
	reps, err := c.ReplicasOf(q)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v, %v", q.Addr, reps, err)
	}
	qid, err := q.Do("CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reps[0].Pause()
	resumed := false
	defer func() {
		if !resumed {
			reps[0].Resume()
		}
	}()
	slot := fmt.Sprint(redistest.KeySlot(key))
	prim, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range append([]*redistest.Server{q, p}, prim...) { // the replicas learn it from them
		if out, err := n.Do("CLUSTER", "SETSLOT", slot, "NODE", qid); err != nil || out != "OK" {
			t.Fatalf("CLUSTER SETSLOT %s NODE %s on %s: %q, %v", slot, qid, n.Addr, out, err)
		}
	}
	err = st.Create(ctx, durableSessionOf(svc, "m1"))
	if !errors.Is(err, session.ErrStoreUnavailable) {
		t.Fatalf("create after its slot moved to a primary whose replica is stopped: %v, want 503 StoreUnavailable", err)
	}
	testutil.EventuallyWithin(t, 30*time.Second, "a create refused by the new primary's WAIT (0 of 1 replicas)", func() bool {
		err := st.Create(ctx, durableSessionOf(svc, "m"+sessiontest.RandomHex(t, 4)))
		return notDurable(err) && strings.Contains(err.Error(), "0 of 1 replicas")
	})
	reps[0].Resume()
	resumed = true
	testutil.EventuallyWithin(t, time.Minute, "the stopped replica learning that its primary serves the moved slot", func() bool {
		nodes, err := c.Topology(reps[0])
		if err != nil {
			return false
		}
		n := redistest.KeySlot(key)
		for _, x := range nodes {
			for _, r := range x.Slots {
				if x.ID == qid && n >= r[0] && n <= r[1] {
					return true
				}
			}
		}
		return false
	})
	id := ""
	testutil.EventuallyWithin(t, time.Minute, "creates acknowledged once the new primary's replica runs again", func() bool {
		id = "m" + sessiontest.RandomHex(t, 4)
		return st.Create(ctx, durableSessionOf(svc, id)) == nil
	})
	if out, err := replicaHGet(reps[0].Addr, prefix+"{"+svc+"}:s:"+id, "inst"); err != nil || out != "i1" {
		t.Errorf("session %s on the new primary's replica right after its create: %q, %v", id, out, err)
	}
}

// replicaHGet reads a hash field on a Cluster replica itself (READONLY, then HGET, on one
// connection).
func replicaHGet(addr, key, field string) (string, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := c.DoMulti(ctx, c.B().Readonly().Build(), c.B().Hget().Key(key).Field(field).Build())
	if err := res[0].Error(); err != nil {
		return "", err
	}
	return res[1].ToString()
}

// checkServiceListNodeDown: the service list (Pservices, no hash tag) lives on one primary.
// While that primary is stopped (SIGSTOP, shorter than the node timeout: no failover), the first
// session of a new service whose own primary is up is still created; once the list's primary
// answers again, Run records the service (a List over every service finds the session).
func checkServiceListNodeDown(t *testing.T, c *redistest.Cluster, st *redisstore.Store, prefix string) {
	ctx := context.Background()
	listNode, err := c.PrimaryOf(prefix + "services")
	if err != nil {
		t.Fatal(err)
	}
	fresh := ""
	for i := 0; fresh == ""; i++ {
		name := fmt.Sprint("fresh", i)
		if p, err := c.PrimaryOf(prefix + "{" + name + "}"); err == nil && p != listNode {
			fresh = name
		}
	}
	listNode.Pause()
	resumed := false
	defer func() {
		if !resumed {
			listNode.Resume()
		}
	}()
	if err := st.Create(ctx, sessiontest.Session(fresh, "n1", "x")); err != nil {
		t.Fatalf("first session of %s while the service list's node is stopped: %v", fresh, err)
	}
	listNode.Resume()
	resumed = true
	testutil.EventuallyWithin(t, time.Minute, "the session of "+fresh+" in a List over every service", func() bool {
		list, _, err := st.List(ctx, session.Filter{}, "", session.MaxListLimit)
		if err != nil {
			return false
		}
		for _, s := range list {
			if s.Service == fresh && s.ID == "n1" {
				return true
			}
		}
		return false
	})
}

func durableSessionOf(service, id string) session.Session {
	s := durableSession(id)
	s.Service = service
	return s
}

// checkClusterFailover: sessions of every service acknowledged; the primary of the first
// service killed (kill -9): after its replica's promotion every acknowledged session is there
// (read on the new primary itself); the other primaries' services kept taking new sessions;
// the killed one's get 503 until the killed node, restarted, replicates again.
func checkClusterFailover(t *testing.T, c *redistest.Cluster, st *redisstore.Store, prefix string, services []string, owner map[string]*redistest.Server) {
	ctx := context.Background()
	acked := map[string][]string{}
	for _, svc := range services {
		for i := range 20 {
			// A replica that has just (re)synchronized acknowledges nothing for up to a second:
			// such a create is refused (and ended again); only acknowledged ones count.
			var id string
			testutil.EventuallyWithin(t, time.Minute, "a create on "+svc+" acknowledged", func() bool {
				id = fmt.Sprintf("f%02d-%s", i, sessiontest.RandomHex(t, 3))
				err := st.Create(ctx, durableSessionOf(svc, id))
				if err != nil && !errors.Is(err, session.ErrStoreUnavailable) {
					t.Fatalf("create %s/%s: %v", svc, id, err)
				}
				return err == nil
			})
			acked[svc] = append(acked[svc], id)
		}
	}
	victim := owner[services[0]]
	reps, err := c.ReplicasOf(victim)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v, %v", victim.Addr, reps, err)
	}
	killed := time.Now()
	c.Kill(victim)
	if err := c.WaitHealthy(2 * time.Minute); err != nil {
		t.Fatalf("failover: %v", err)
	}
	t.Logf("failover of %s to %s: %v", victim.Addr, reps[0].Addr, time.Since(killed).Round(time.Millisecond))
	for _, svc := range services {
		p, err := c.PrimaryOf(prefix + "{" + svc + "}")
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range acked[svc] {
			if out, err := p.Do("HGET", prefix+"{"+svc+"}:s:"+id, "inst"); err != nil || out != "i1" {
				t.Errorf("acknowledged session %s/%s after the failover, on %s: %q, %v", svc, id, p.Addr, out, err)
			}
		}
	}
	for _, svc := range services {
		if owner[svc] == victim {
			continue
		}
		testutil.EventuallyWithin(t, time.Minute, "a create on "+svc+" (its primary alive) after the failover", func() bool {
			return st.Create(ctx, durableSessionOf(svc, "after"+sessiontest.RandomHex(t, 3))) == nil
		})
	}
	err = st.Create(ctx, durableSessionOf(services[0], "alone"))
	if !errors.Is(err, session.ErrStoreUnavailable) {
		t.Errorf("create on %s, whose new primary has no replica: %v, want 503 StoreUnavailable", services[0], err)
	}
	c.Restart(victim)
	testutil.EventuallyWithin(t, 2*time.Minute, "creates on "+services[0]+" acknowledged once the killed node replicates the new primary", func() bool {
		return st.Create(ctx, durableSessionOf(services[0], "back"+sessiontest.RandomHex(t, 4))) == nil
	})
	t.Logf("new sessions of %s acknowledged again %v after the kill", services[0], time.Since(killed).Round(time.Millisecond))
}
