package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// TestRedisPlacementIsExactAcrossReplicas: 300 concurrent placements through three handles
// (three replicas) onto three instances of 50 session slots fill every slot exactly: 150
// succeed, the rest get ErrNoRoom, and the store's counts match the bindings; after every end
// (explicit or by the reaper) every count is back to 0.
func TestRedisPlacementIsExactAcrossReplicas(t *testing.T) {
	handles, clock := replicaHandles(t, 3)
	cands := []session.PlaceCandidate{{Instance: "i1", Cap: 50}, {Instance: "i2", Cap: 50}, {Instance: "i3", Cap: 50}}
	ctx := context.Background()
	var placed, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 300 {
		wg.Go(func() {
			s := sessiontest.Session("web", fmt.Sprintf("s%03d", g), "x")
			if g%10 == 0 {
				s.Kind = session.KindSticky // holds no slot: never counted, never refused
			}
			_, _, err := handles[g%3].PlaceCreate(ctx, s, cands)
			switch {
			case err == nil:
				if s.Kind != session.KindSticky {
					placed.Add(1)
				}
			case errors.Is(err, session.ErrNoRoom):
				refused.Add(1)
			default:
				t.Errorf("PlaceCreate: %v", err)
			}
		})
	}
	wg.Wait()
	sessiontest.Diff(t, "placed slot-holding sessions", int64(150), placed.Load())
	for _, c := range cands {
		list, err := handles[0].ActiveByInstance(ctx, "web", c.Instance)
		if err != nil {
			t.Fatal(err)
		}
		holding := 0
		for _, s := range list {
			if s.Kind != session.KindSticky {
				holding++
			}
		}
		sessiontest.Diff(t, "bindings holding a slot on "+c.Instance, 50, holding)
		sessiontest.Diff(t, "count of "+c.Instance, 50, handles[1].SessionCount(ctx, "web", c.Instance))
	}

	// A move keeps the counts exact: free one slot on i1 by ending a session, move one from i3.
	onI3, _ := handles[0].ActiveByInstance(ctx, "web", "i3")
	onI1, _ := handles[0].ActiveByInstance(ctx, "web", "i1")
	var mover, ender string
	for _, s := range onI3 {
		if s.Kind != session.KindSticky {
			mover = s.ID
			break
		}
	}
	for _, s := range onI1 {
		if s.Kind != session.KindSticky {
			ender = s.ID
			break
		}
	}
	if _, err := handles[2].End(ctx, "web", ender, session.StatusTerminated, clock.Now()); err != nil {
		t.Fatal(err)
	}
	to, err := handles[1].PlaceMove(ctx, "web", mover, "i3", cands[:2])
	if err != nil || to != "i1" {
		t.Fatalf("PlaceMove: %q, %v; want i1", to, err)
	}
	if _, err := handles[1].PlaceMove(ctx, "web", mover, "i3", cands[:2]); !errors.Is(err, session.ErrChanged) {
		t.Errorf("second PlaceMove from i3: %v, want ErrChanged", err)
	}
	if _, err := handles[0].PlaceMove(ctx, "web", onI3[len(onI3)-1].ID, "i3", cands[:2]); !errors.Is(err, session.ErrNoRoom) {
		t.Errorf("PlaceMove onto full instances: %v, want ErrNoRoom", err)
	}
	testutil.Eventually(t, "counts after the move", func() bool {
		return handles[0].SessionCount(ctx, "web", "i1") == 50 && handles[0].SessionCount(ctx, "web", "i3") == 49
	})

	// Let every session lapse: the reaper (on whichever handle holds its lease) ends them all.
	clock.Advance(time.Hour)
	for _, h := range handles {
		if _, _, err := h.Reap(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cands {
		testutil.Eventually(t, "count of "+c.Instance+" back to 0", func() bool { return handles[2].SessionCount(ctx, "web", c.Instance) == 0 })
		if list, _ := handles[0].ActiveByInstance(ctx, "web", c.Instance); len(list) != 0 {
			t.Errorf("%s still binds %d sessions", c.Instance, len(list))
		}
	}
}

// TestRedisPlacementRule: the fullest active instance with room first, standby only when
// every active one is full (scale-out), then ErrNoRoom.
func TestRedisPlacementRule(t *testing.T) {
	srv := redistest.Start(t)
	clock := testutil.NewClock(sessiontest.Start())
	st := newRedisStore(t, redisstore.Config{Addrs: []string{srv.Addr}}, redisstore.WithManualClock(clock.Now))
	cands := []session.PlaceCandidate{{Instance: "a", Cap: 2}, {Instance: "b", Cap: 2}, {Instance: "s", Cap: 1, Standby: true}}
	var got []string
	for i := range 6 {
		inst, scaleOut, err := st.PlaceCreate(context.Background(), sessiontest.Session("web", fmt.Sprint("s", i), "x"), cands)
		switch {
		case errors.Is(err, session.ErrNoRoom):
			got = append(got, "none")
		case err != nil:
			t.Fatal(err)
		default:
			got = append(got, fmt.Sprintf("%s/%v", inst, scaleOut))
		}
	}
	sessiontest.Diff(t, "placements", []string{"a/false", "a/false", "b/false", "b/false", "s/true", "none"}, got)
}
