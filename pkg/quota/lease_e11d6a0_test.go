package quota_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/history"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/pkg/quota"
)

// e11d6a0Replica plays a replica of e11d6a0 with its lease script, verbatim: every admission
// borrows one slot (delta +1) and every release returns it (delta −1), so what it has in
// flight is exactly what Redis records for it.
type e11d6a0Replica struct {
	c      rueidis.Client
	script *rueidis.Lua
	name   string
	cap    int
}

func (o e11d6a0Replica) call(ctx context.Context, delta int) ([]int64, error) {
	return o.script.Exec(ctx, o.c, []string{"q:{web}:L:i1", "q:{web}:lx"}, []string{o.name, "i1",
		strconv.Itoa(delta), strconv.Itoa(o.cap), strconv.FormatInt(time.Now().UnixMilli(), 10), "10000"}).AsIntSlice()
}

// TestMixedProtocolsHoldTheCap: one instance of 50 slots shared by a replica of e11d6a0 (its
// script verbatim) and two replicas of this build speaking protocol 1; then the e11d6a0
// replica stops hammering (it keeps 10 slots held, as a record of protocol 1 that a switching
// replica leaves), one replica switches to protocol 2, then the other. In every phase the
// three together never have more than 50 exchanges certainly in flight (history checker),
// every phase admits, and the switch starts no learning window. Once records of protocol 2
// are in the hash, e11d6a0's script fails (an error reply) instead of counting them wrong.
func TestMixedProtocolsHoldTheCap(t *testing.T) {
	srv := redistest.Start(t)
	const capN = 50
	capFn := func() int { return capN }
	h := history.New()
	old := e11d6a0Replica{c: client(t, srv.Addr), script: rueidis.NewLuaScript(quota.LeaseScriptE11d6a0Verbatim), name: "old", cap: capN}
	ctx := context.Background()
	var pools []*quota.Pool
	var leases []*quota.Leases
	for _, name := range []string{"b", "c"} {
		l, _ := replica(t, srv.Addr, name)
		l.SpeakProtocol(1)
		leases = append(leases, l)
		pools = append(pools, l.Pool("web", "i1", capFn))
	}
	// The long-lived exchanges of the e11d6a0 replica.
	res, err := old.call(ctx, 10)
	if err != nil || res[0] != 10 {
		t.Fatalf("e11d6a0 replica's first borrow: %v %v", res, err)
	}
	var held []*history.Admission
	for range 10 {
		held = append(held, h.Admit("i1", "old"))
	}

	var admitted [3]atomic.Int64 // per phase
	var phase atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 60 {
		p := pools[g%2]
		name := string(rune('b' + g%2))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !p.TryAcquire(ctx) {
					time.Sleep(time.Millisecond)
					continue
				}
				a := h.Admit("i1", name)
				admitted[phase.Load()].Add(1)
				time.Sleep(300 * time.Microsecond)
				a.Release()
				p.Release()
			}
		})
	}
	var oldDone = make(chan struct{})
	var oldErrs atomic.Int64
	for range 20 {
		wg.Go(func() {
			for {
				select {
				case <-oldDone:
					return
				default:
				}
				res, err := old.call(ctx, 1)
				if err != nil {
					oldErrs.Add(1)
					continue
				}
				if res[0] != 1 {
					time.Sleep(time.Millisecond)
					continue
				}
				a := h.Admit("i1", "old")
				admitted[0].Add(1)
				time.Sleep(300 * time.Microsecond)
				a.Release()
				if _, err := old.call(ctx, -1); err != nil {
					oldErrs.Add(1)
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	close(oldDone)
	phase.Store(1)
	leases[0].SpeakProtocol(2)
	time.Sleep(1500 * time.Millisecond)
	phase.Store(2)
	leases[1].SpeakProtocol(2)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, a := range held {
		a.Release()
	}
	peaks, err := h.CheckCap(func(string) int { return capN })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted per phase (e11d6a0 + protocol 1 ×2; protocol 2 + 1; protocol 2 ×2): %d, %d, %d; peak %v; e11d6a0 script errors %d",
		admitted[0].Load(), admitted[1].Load(), admitted[2].Load(), peaks, oldErrs.Load())
	for i := range admitted {
		if admitted[i].Load() == 0 {
			t.Errorf("phase %d admitted nothing", i)
		}
	}
	if oldErrs.Load() != 0 {
		t.Errorf("e11d6a0's script failed %d times while only records of protocol 1 were written", oldErrs.Load())
	}
	for i, p := range pools {
		if p.Learning() {
			t.Errorf("replica %d is in a learning window after the switch", i)
		}
	}
	// Records of protocol 2 are in the hash now: e11d6a0's script refuses rather than counts.
	if out, _ := srv.Do("HGETALL", "q:{web}:L:i1"); !strings.Contains(out, ",") {
		t.Fatalf("no record of protocol 2 after the switch: %s", out)
	}
	if _, err := old.call(ctx, 1); err == nil {
		t.Error("e11d6a0's script ran on records of protocol 2 without an error")
	}
}
