package session

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestHotTableReadersNeverMissALiveRecord drives the lock-free hot table directly (a miss
// there is invisible through Get, which falls back to memdb, but would drop Touches): readers
// look up a fixed set of records without pause while the one writer inserts, replaces and
// removes thousands of others, so that every shard grows, fills with tombstones and is
// rebuilt several times.
func TestHotTableReadersNeverMissALiveRecord(t *testing.T) {
	st := NewMemStore()
	tbl := st.hot
	rec := func(id string) *record {
		return st.newRecord(Session{ID: id, Service: "web", Instance: "a", Status: StatusActive}, nil, nil)
	}
	const fixed = 64
	want := make([]*record, fixed)
	for i := range want {
		want[i] = rec(fmt.Sprintf("fixed-%d", i))
		tbl.put(want[i])
	}
	var stop atomic.Bool
	var misses, reads atomic.Int64
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; !stop.Load() || reads.Load() < 2_000; i++ {
				if i%64 == 0 {
					runtime.Gosched()
				}
				r := want[i%fixed]
				if tbl.get("web", r.id()) != r {
					misses.Add(1)
				}
				reads.Add(1)
			}
		}()
	}
	for round := range 4 {
		churn := make([]*record, 4000)
		for i := range churn {
			churn[i] = rec(fmt.Sprintf("churn-%d-%d", round, i))
			tbl.put(churn[i])
		}
		for i := range churn {
			if i%2 == 0 {
				next := rec(churn[i].id())
				tbl.put(next) // a new version replaces the old in place
				churn[i] = next
			}
		}
		for _, r := range churn {
			if tbl.get("web", r.id()) != r {
				t.Fatalf("round %d: %s not found after its insert", round, r.id())
			}
			tbl.remove(r)
		}
		for _, r := range churn {
			if got := tbl.get("web", r.id()); got != nil {
				t.Fatalf("round %d: %s found after its removal", round, r.id())
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if misses.Load() != 0 {
		t.Errorf("%d of %d lookups of live records missed", misses.Load(), reads.Load())
	}
	if n := tbl.count(); n != fixed {
		t.Errorf("table holds %d records, want %d", n, fixed)
	}
	stale := rec("fixed-0")
	tbl.remove(stale) // not the current version: must not drop fixed-0
	if tbl.get("web", "fixed-0") != want[0] {
		t.Error("removing a stale version dropped the current one")
	}
}
