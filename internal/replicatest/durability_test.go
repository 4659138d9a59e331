package replicatest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

// ackLoad makes new sessions through one engine from several goroutines (each at most 100/s),
// as clients without a cookie do, and records every one acknowledged (Decide returned a decision: the client got its
// Set-Cookie) with the time it was.
type ackLoad struct {
	mu    sync.Mutex
	ids   []string
	at    map[string]time.Time
	tries atomic.Int64
	fails atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startLoad(e *affinity.Engine, workers int) *ackLoad {
	l := &ackLoad{at: map[string]time.Time{}, stop: make(chan struct{})}
	for range workers {
		l.wg.Go(func() {
			pace := time.NewTicker(10 * time.Millisecond) // at most 100 new sessions/s per worker
			defer pace.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-pace.C:
				}
				d, err := decide(e, "")
				l.tries.Add(1)
				if err != nil {
					l.fails.Add(1)
					continue
				}
				now := time.Now()
				l.mu.Lock()
				l.ids = append(l.ids, d.SessionID())
				l.at[d.SessionID()] = now
				l.mu.Unlock()
				d.End()
			}
		})
	}
	return l
}

// acknowledged returns the sessions acknowledged so far.
func (l *ackLoad) acknowledged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids)
}

func (l *ackLoad) ackedAt(id string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[id]
}

// waitFor waits until n more sessions were acknowledged (or, with tries, attempted).
func (l *ackLoad) waitFor(t *testing.T, n int, tries bool) {
	t.Helper()
	count := func() int {
		if tries {
			return int(l.tries.Load())
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.ids)
	}
	base := count()
	testutil.EventuallyWithin(t, 2*time.Minute, fmt.Sprintf("%d more new sessions", n), func() bool { return count() >= base+n })
}

func (l *ackLoad) end() {
	close(l.stop)
	l.wg.Wait()
}

// missing returns the ids whose record the redis-server at addr does not have (EXISTS on a
// connection of its own, past every cache; addr is the primary).
func missing(t *testing.T, addr, prefix string, ids []string) []string {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []string
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 500)]
		ids = ids[len(batch):]
		var res []int64
		var last error
		defer func() {
			if t.Failed() && last != nil {
				t.Logf("last EXISTS error: %v", last)
			}
		}()
		testutil.EventuallyWithin(t, time.Minute, "Redis answering EXISTS", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res = res[:0]
			cmds := make([]rueidis.Completed, len(batch))
			for i, id := range batch {
				cmds[i] = c.B().Exists().Key(prefix + "{fn}:s:" + id).Build()
			}
			for _, r := range c.DoMulti(ctx, cmds...) {
				n, err := r.AsInt64()
				if err != nil {
					last = err
					return false
				}
				res = append(res, n)
			}
			return true
		})
		for i, n := range res {
			if n == 0 {
				out = append(out, batch[i])
			}
		}
	}
	return out
}

// busyDisk keeps the filesystem of dir busy until the test ends: a writer appends blocks of
// block bytes to a file there and fsyncs each one (starting the file again past 256 MiB), so
// that Redis's own fsyncs of its append-only file wait behind it. With appendfsync everysec,
// Redis then postpones writing its AOF buffer (up to 2 s), and a kill -9 loses what it held.
func busyDisk(t *testing.T, dir string, block int) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "busy-disk"))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, block)
		var size int
		for {
			select {
			case <-stop:
				return
			default:
			}
			if size > 256<<20 {
				_ = f.Truncate(0)
				_, _ = f.Seek(0, 0)
				size = 0
			}
			n, err := f.Write(buf)
			size += n
			if err != nil {
				return
			}
			_ = f.Sync()
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait(); _ = f.Close(); _ = os.Remove(f.Name()) })
}

// lossReport sums what a schedule lost: the acknowledged sessions missing after each fault,
// and how long before its fault the latest lost one was acknowledged.
type lossReport struct {
	faults, acked, lost int
	lostIn              int // faults that lost at least one
	window              time.Duration
}

func (r lossReport) String() string {
	s := fmt.Sprintf("%d faults, %d acknowledged sessions, %d lost", r.faults, r.acked, r.lost)
	if r.lost > 0 {
		s += fmt.Sprintf(" (in %d of the faults; the earliest lost one acknowledged %v before its fault)", r.lostIn, r.window.Round(time.Millisecond))
	}
	return s
}

// checkAfterFault adds the ids newly missing after the fault at faultAt to rep (lost: ids
// already counted).
func checkAfterFault(t *testing.T, primary, prefix string, l *ackLoad, faultAt time.Time, lost map[string]bool, rep *lossReport) {
	t.Helper()
	rep.faults++
	n := 0
	for _, id := range missing(t, primary, prefix, l.acknowledged()) {
		if lost[id] {
			continue
		}
		lost[id] = true
		n++
		if at := l.ackedAt(id); at.Before(faultAt) {
			rep.window = max(rep.window, faultAt.Sub(at))
		}
	}
	rep.lost += n
	if n > 0 {
		rep.lostIn++
	}
}

// durabilityCase is one mode of a schedule.
type durabilityCase struct {
	name  string
	fsync string // the redis-server's appendfsync
	dur   redisstore.Durability
	// mustKeep: 0 acknowledged sessions may be lost (otherwise the loss is measured only).
	mustKeep bool
}

// TestAckDurabilityAOFUnderKills: sessions made from 8 goroutines while redis-server is killed
// (kill -9) and restarted from its append-only file, again and again, with the disk kept busy
// by a writer fsyncing on the same filesystem. With ackDurability aof (appendfsync always),
// every acknowledged session is there after every restart. With the default none on
// appendfsync everysec the loss is measured: Redis postpones its AOF writes while the disk is
// busy, and a kill -9 loses what it held. A kill -9 keeps the kernel's page cache, so what is
// tested is Redis's own buffering; a machine crash (power) cannot be tested here. `make faults`
// runs 20 kills per mode (TETHER_FAULTS=long); make test 3 of aof.
func TestAckDurabilityAOFUnderKills(t *testing.T) {
	long := os.Getenv("TETHER_FAULTS") == "long"
	kills, per, block := 3, 100, 1<<20
	cases := []durabilityCase{{name: "aof", fsync: "always", dur: redisstore.Durability{Mode: redisstore.AckAOF}, mustKeep: true}}
	if long {
		kills, per, block = 20, 300, 4<<20
		cases = append([]durabilityCase{{name: "none", fsync: "everysec", dur: redisstore.Durability{Mode: redisstore.AckNone}}}, cases...)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithAOF(tc.fsync))
			busyDisk(t, srv.Dir, block)
			reps := replicatest.Start(t, srv.Addr, 1, []registry.Service{benchService(1 << 20)}, affinitytest.Instances("fn", 3),
				replicatest.Options{Durability: tc.dur, OpTimeout: 5 * time.Second})
			st := reps[0].Store
			load := startLoad(reps[0].Engine, 8)
			lost := map[string]bool{}
			var rep lossReport
			for range kills {
				load.waitFor(t, per, false)
				killed := time.Now()
				srv.Kill()
				srv.Restart()
				checkAfterFault(t, srv.Addr, st.KeyPrefix(), load, killed, lost, &rep)
			}
			load.end()
			rep.acked = len(load.acknowledged())
			t.Logf("| %s (appendfsync %s) | %s | %d creates refused during the outages |", tc.name, tc.fsync, rep, load.fails.Load())
			if tc.mustKeep && rep.lost > 0 {
				t.Errorf("ackDurability %s lost %d acknowledged sessions over %d kills", tc.name, rep.lost, kills)
			}
		})
	}
}

// TestAckDurabilityReplicaUnderFailovers: sessions made from 8 goroutines through a
// Sentinel-addressed store while the primary fails over again and again. Each failover is the
// kind that loses writes: the primary loses its replica (CLIENT KILL TYPE replica), takes
// writes for a moment without it, and is killed (kill -9); the Sentinel promotes the replica,
// and the old primary comes back empty and becomes the new one's replica. With ackDurability
// replica (WAIT 1), every acknowledged session is on the new primary after every failover;
// with the default none the loss is measured. `make faults` runs 10 failovers per mode
// (TETHER_FAULTS=long); make test one of replica.
func TestAckDurabilityReplicaUnderFailovers(t *testing.T) {
	long := os.Getenv("TETHER_FAULTS") == "long"
	failovers := 1
	cases := []durabilityCase{{name: "replica", dur: redisstore.Durability{Mode: redisstore.AckReplica, Timeout: 50 * time.Millisecond}, mustKeep: true}}
	if long {
		failovers = 10
		cases = append([]durabilityCase{{name: "none", dur: redisstore.Durability{Mode: redisstore.AckNone}}}, cases...)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sn := redistest.StartSentinelDownAfter(t, 3*time.Second)
			reps := replicatest.Start(t, sn.Sentinel.Addr, 1, []registry.Service{benchService(1 << 20)}, affinitytest.Instances("fn", 3),
				replicatest.Options{Durability: tc.dur, MasterSet: sn.MasterSet, OpTimeout: 5 * time.Second})
			st := reps[0].Store
			load := startLoad(reps[0].Engine, 8)
			lost := map[string]bool{}
			var rep lossReport
			defer func() {
				if t.Failed() {
					t.Logf("sentinel log:\n%s", sn.Sentinel.Log())
				}
			}()
			for i := range failovers {
				p, r := settled(t, sn)
				t.Logf("failover %d: primary %s, replica %s, %d sessions acknowledged so far", i+1, p.Addr, r.Addr, len(load.acknowledged()))
				load.waitFor(t, 200, false)
				if _, err := p.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil {
					t.Fatal(err)
				}
				load.waitFor(t, 50, true) // writes on the primary alone (none: acknowledged; replica: refused)
				killed := time.Now()
				p.Kill()
				testutil.EventuallyWithin(t, 2*time.Minute, "the Sentinel promoting the replica", func() bool {
					a, err := sn.PrimaryAddr()
					return err == nil && a == r.Addr
				})
				p.Restart() // empty (no persistence): the Sentinel makes it the new primary's replica
				checkAfterFault(t, r.Addr, st.KeyPrefix(), load, killed, lost, &rep)
			}
			load.end()
			rep.acked = len(load.acknowledged())
			t.Logf("| %s | %s | %d creates refused |", tc.name, rep, load.fails.Load())
			if tc.mustKeep && rep.lost > 0 {
				t.Errorf("ackDurability %s lost %d acknowledged sessions over %d failovers", tc.name, rep.lost, failovers)
			}
		})
	}
}

// settled waits until the Sentinel's primary is a primary in sync with the other server as its
// replica, and returns them.
func settled(t *testing.T, sn *redistest.Sentinel) (p, r *redistest.Server) {
	t.Helper()
	servers := []*redistest.Server{sn.Primary, sn.Replica}
	defer func() {
		if t.Failed() {
			for _, s := range servers {
				info, _ := s.Do("INFO", "replication")
				t.Logf("%s:\n%s", s.Addr, info)
			}
		}
	}()
	testutil.EventuallyWithin(t, 2*time.Minute, "the Sentinel's primary in sync with its replica", func() bool {
		a, err := sn.PrimaryAddr()
		if err != nil {
			return false
		}
		p, r = servers[0], servers[1]
		if a == servers[1].Addr {
			p, r = servers[1], servers[0]
		}
		info, err := p.Do("INFO", "replication")
		if err != nil || !strings.Contains(info, "role:master") || !strings.Contains(info, "connected_slaves:1") || !strings.Contains(info, "state=online") {
			return false
		}
		rinfo, err := r.Do("INFO", "replication")
		return err == nil && strings.Contains(rinfo, "master_port:"+p.Addr[strings.LastIndex(p.Addr, ":")+1:]) && strings.Contains(rinfo, "master_link_status:up")
	})
	return p, r
}

// TestAckReplicaStoppedIsStoreUnavailable: what a client sees with ackDurability replica when
// no replica acknowledges in time (the replica stopped with SIGSTOP): a new session gets 503
// StoreUnavailable with Retry-After, and the session its request wrote is ended again (its slot
// given back); known sessions keep routing. Once the replica runs again, new sessions are
// acknowledged.
func TestAckReplicaStoppedIsStoreUnavailable(t *testing.T) {
	sn := redistest.StartSentinel(t)
	reps := replicatest.Start(t, sn.Primary.Addr, 1, []registry.Service{benchService(50)}, affinitytest.Instances("fn", 2),
		replicatest.Options{Durability: redisstore.Durability{Mode: redisstore.AckReplica, Timeout: 50 * time.Millisecond}})
	e, st := reps[0].Engine, reps[0].Store
	var id, inst string
	testutil.EventuallyWithin(t, 30*time.Second, "a new session acknowledged (the primary streaming to its replica)", func() bool {
		d, err := decide(e, "")
		if err != nil {
			return false
		}
		id, inst = d.SessionID(), d.Instance().ID
		d.End()
		return true
	})
	ctx := context.Background()
	held := func() int { // read past the client-side cache
		c := st.Client()
		n := 0
		for _, inst := range []string{"i1", "i2"} {
			v, err := c.Do(ctx, c.B().Hget().Key(st.KeyPrefix()+"{fn}:n").Field(inst).Build()).AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatal(err)
			}
			n += int(v)
		}
		return n
	}
	before := held()

	sn.Replica.Pause()
	defer sn.Replica.Resume()
	_, err := decide(e, "")
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Code != "StoreUnavailable" || rej.RetryAfter <= 0 {
		t.Fatalf("new session with no replica acknowledging: %v, want 503 StoreUnavailable with Retry-After", err)
	}
	if after := held(); after != before {
		t.Errorf("session slots held: %d after the refused session, %d before: want its slot given back", after, before)
	}
	d, err := decide(e, id)
	if err != nil || d.Instance().ID != inst {
		t.Fatalf("known session with no replica acknowledging: %v", err)
	}
	d.End()

	sn.Replica.Resume()
	testutil.EventuallyWithin(t, 30*time.Second, "new sessions acknowledged again", func() bool {
		d, err := decide(e, "")
		if err == nil {
			d.End()
		}
		return err == nil
	})
}
