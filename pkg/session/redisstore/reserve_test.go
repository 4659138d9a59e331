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

// TestRedisReservationsAreExactAcrossReplicas: 300 concurrent reservations through three
// handles onto three instances of 20 session slots, 10 of them already taken by sessions,
// fill the 50 free slots exactly; converting a reservation into a session keeps the count (on
// another instance it moves); releasing frees it; the counts end at the bound sessions and no
// reservation is left.
func TestRedisReservationsAreExactAcrossReplicas(t *testing.T) {
	handles, _ := replicaHandles(t, 3)
	cands := []session.PlaceCandidate{{Instance: "i1", Cap: 20}, {Instance: "i2", Cap: 20}, {Instance: "i3", Cap: 20}}
	ctx := context.Background()
	for i := range 10 {
		if _, _, err := handles[0].PlaceCreate(ctx, sessiontest.Session("mcp", fmt.Sprintf("pre%02d", i), "x"), cands); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var held []session.Reservation
	var refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 300 {
		wg.Go(func() {
			rsv, err := handles[g%3].Reserve(ctx, "mcp", cands)
			switch {
			case err == nil:
				mu.Lock()
				held = append(held, rsv)
				mu.Unlock()
			case errors.Is(err, session.ErrNoRoom):
				refused.Add(1)
			default:
				t.Errorf("Reserve: %v", err)
			}
		})
	}
	wg.Wait()
	sessiontest.Diff(t, "reservations granted", 50, len(held))
	count := func(inst string) int { return handles[1].SessionCount(ctx, "mcp", inst) }
	for _, c := range cands {
		sessiontest.Diff(t, "count of "+c.Instance+" (sessions and reservations)", 20, count(c.Instance))
	}
	if _, err := handles[2].Reserve(ctx, "mcp", cands); !errors.Is(err, session.ErrNoRoom) {
		t.Fatalf("a reservation beyond every cap: %v, want ErrNoRoom", err)
	}
	if _, _, err := handles[2].PlaceCreate(ctx, sessiontest.Session("mcp", "late", "x"), cands); !errors.Is(err, session.ErrNoRoom) {
		t.Fatalf("a placement beyond the caps the reservations fill: %v, want ErrNoRoom", err)
	}

	// Convert half (one of them onto another instance than reserved), release the rest.
	bound := map[string]int{"i1": 0, "i2": 0, "i3": 0}
	for i, rsv := range held {
		h := handles[i%3]
		if i%2 == 1 {
			if err := h.Release(ctx, rsv); err != nil {
				t.Fatal(err)
			}
			if err := h.Release(ctx, rsv); err != nil { // idempotent
				t.Fatal(err)
			}
			continue
		}
		s := sessiontest.Session("mcp", fmt.Sprintf("b%02d", i), rsv.Instance)
		if i == 0 {
			s.Instance = map[string]string{"i1": "i2", "i2": "i3", "i3": "i1"}[rsv.Instance]
		}
		if err := h.CreateReserved(ctx, s, rsv); err != nil {
			t.Fatal(err)
		}
		bound[s.Instance]++
	}
	for _, c := range cands {
		list, err := handles[0].ActiveByInstance(ctx, "mcp", c.Instance)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the count of "+c.Instance+" matches its bindings", func() bool { return count(c.Instance) == len(list) })
	}
	if n, err := handles[0].ReservationCount(ctx, "mcp"); err != nil || n != 0 {
		t.Fatalf("reservations left after every one was converted or released: %d, %v", n, err)
	}
	total := 0
	for _, n := range bound {
		total += n
	}
	sessiontest.Diff(t, "sessions bound from reservations", 25, total)
}

// TestRedisReservationOfADeadHandleExpires: a reservation whose handle stops renewing it (a
// killed replica: its Run is gone) is freed after the reservation TTL, by the next
// reservation or the reaper; a live handle's reservation outlives the TTL (Run renews it).
func TestRedisReservationOfADeadHandleExpires(t *testing.T) {
	srv := redistest.Start(t)
	cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "w" + sessiontest.RandomHex(t, 6) + ":"}
	const ttl = 300 * time.Millisecond
	// The dead handle never runs Run; the live one does (real clock: renewals are timed).
	dead, err := redisstore.New(cfg, redisstore.WithReservationTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	live, err := redisstore.New(cfg, redisstore.WithReservationTTL(ttl), redisstore.WithReapInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = live.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; live.Close() })

	one := []session.PlaceCandidate{{Instance: "i1", Cap: 2}}
	if _, err := dead.Reserve(ctx, "mcp", one); err != nil {
		t.Fatal(err)
	}
	mine, err := live.Reserve(ctx, "mcp", one)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := live.Reserve(ctx, "mcp", one); !errors.Is(err, session.ErrNoRoom) {
		t.Fatalf("a third reservation of two slots: %v, want ErrNoRoom", err)
	}
	if !testutil.Poll(20*ttl, func() bool { return live.SessionCount(ctx, "mcp", "i1") == 1 }) {
		z, _ := srv.Do("ZRANGE", cfg.KeyPrefix+"{mcp}:rsv", "0", "-1", "WITHSCORES")
		n, _ := srv.Do("HGETALL", cfg.KeyPrefix+"{mcp}:n")
		t.Fatalf("the dead handle's reservation not freed: count %d; reservations %q; counts %q; now %d", live.SessionCount(ctx, "mcp", "i1"), z, n, time.Now().UnixMilli())
	}
	t.Logf("a dead handle's reservation was freed %v after it was made (TTL %v)", time.Since(start).Round(time.Millisecond), ttl)
	// The live one is still held, well past its TTL: converting it keeps the count at 1.
	testutil.Eventually(t, "three TTLs pass", func() bool { return time.Since(start) > 3*ttl })
	if n, err := live.ReservationCount(ctx, "mcp"); err != nil || n != 1 {
		t.Fatalf("the live handle's reservation after 3 TTLs: %d reservations, %v", n, err)
	}
	if err := live.CreateReserved(ctx, sessiontest.Session("mcp", "s1", "i1"), mine); err != nil {
		t.Fatal(err)
	}
	sessiontest.Diff(t, "count of i1 after the conversion", 1, live.SessionCount(ctx, "mcp", "i1"))
	if n, _ := live.ReservationCount(ctx, "mcp"); n != 0 {
		t.Errorf("%d reservations left", n)
	}
}
