package quota_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/history"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/quota"
)

// TestDetachedHoldsOutliveTheReplica: replica a holds every slot of an instance (cap 8),
// hands 4 of its exchanges off (Detach, each bounded to end 3 s later), ends the other 4 and
// stops. Its lease record is cleared at once, but replica b — pressing on the instance from
// four goroutines all the while — is lent only the 4 ended slots until the holds expire, then
// all 8. The history checker counts the handed-off exchanges as in flight until their bound.
// The same after a new epoch whose data set kept the holds (the epoch key lost, not the
// data): holds count whatever their epoch.
func TestDetachedHoldsOutliveTheReplica(t *testing.T) {
	const capN, handed, bound = 8, 4, 3 * time.Second
	for _, tc := range []struct {
		name  string
		after func(t *testing.T, srv *redistest.Server) // after a stopped
	}{
		{"replica stopped", func(*testing.T, *redistest.Server) {}},
		{"then a new epoch", func(t *testing.T, srv *redistest.Server) {
			if _, err := srv.Do("DEL", "q:{web}:qe"); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			h := history.New()
			capFn := func() int { return capN }
			opts := []quota.Option{quota.WithTTL(time.Second), quota.WithDegradedFor(2 * time.Second), quota.WithChunk(capN)}
			la, stopA := replica(t, srv.Addr, "a", opts...)
			seed(t, la)
			a := &holder{name: "a", p: la.Pool("web", "i1", capFn), h: h}
			if got := a.take(capN); got != capN {
				t.Fatalf("a took %d of %d", got, capN)
			}
			lb, _ := replica(t, srv.Addr, "b", opts...)
			b := &holder{name: "b", p: lb.Pool("web", "i1", capFn), h: h}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			defer wg.Wait()
			for range 4 { // b presses all the time: every slot it gets it keeps
				wg.Go(func() {
					for ctx.Err() == nil {
						if b.take(1) == 0 {
							time.Sleep(5 * time.Millisecond)
						}
					}
				})
			}

			a.mu.Lock()
			held := a.held
			a.held = nil
			a.mu.Unlock()
			var detachedAt time.Time
			for _, adm := range held[:handed] {
				sent := time.Now()
				if err := a.p.Detach(context.Background(), bound); err != nil {
					t.Fatalf("detach: %v", err)
				}
				// The exchange goes on without a, and ends by its bound at the latest
				// (At half of it here: a timer late by less than that plus the margin is still before
				// the hold's expiry on a loaded machine; that the hold lasts the whole bound is
				// checked below.)
				time.AfterFunc(time.Until(sent.Add(bound/2)), adm.Release)
				detachedAt = sent
			}
			if got := a.p.InFlight(); got != capN-handed {
				t.Errorf("a's in use after detaching %d: %d, want %d", handed, got, capN-handed)
			}
			if got := a.p.Detached(); got != handed {
				t.Errorf("a's pool reports %d detached holds, want %d", got, handed)
			}
			for _, adm := range held[handed:] {
				adm.Release()
				a.p.Release()
			}
			stopA()
			if out, _ := srv.Do("HEXISTS", "q:{web}:L:i1", "a"); out != "0" {
				t.Errorf("a's lease record left after it stopped (HEXISTS %s): its holds are records of their own", out)
			}
			tc.after(t, srv)

			testutil.EventuallyWithin(t, 30*time.Second, "b holds every slot once the holds expired", func() bool { return b.count() == capN })
			took := time.Since(detachedAt)
			cancel()
			wg.Wait()
			if took < bound {
				t.Errorf("b had all %d slots %v after the handoff, before the exchanges' bound %v", capN, took, bound)
			}
			if got := b.p.Detached(); got != 0 {
				t.Errorf("b's pool reports %d detached holds after they expired", got)
			}
			testutil.EventuallyWithin(t, 10*time.Second, "the holds' key gone", func() bool {
				out, _ := srv.Do("EXISTS", "q:{web}:D:i1")
				return out == "0"
			})
			peaks, err := h.CheckCap(func(string) int { return capN })
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("b had every slot %v after a handed %d off (bound %v, margin incl.); peak %v", took.Round(time.Millisecond), handed, bound, peaks)
		})
	}
}

// TestDetachRefusals: a slot is detached only while Redis still counts it in this replica's
// lease under the current epoch; every refusal leaves the slot in use here.
func TestDetachRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		take   bool
		bound  time.Duration
		before func(t *testing.T, srv *redistest.Server, l *quota.Leases, p *quota.Pool)
	}{
		{name: "no bound", take: true, bound: 0},
		{name: "no slot in use", take: false, bound: time.Minute},
		{name: "lease gone from Redis", take: true, bound: time.Minute, before: func(t *testing.T, srv *redistest.Server, _ *quota.Leases, _ *quota.Pool) {
			if _, err := srv.Do("HDEL", "q:{web}:L:i1", "a"); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "epoch lost", take: true, bound: time.Minute, before: func(t *testing.T, srv *redistest.Server, _ *quota.Leases, _ *quota.Pool) {
			if _, err := srv.Do("DEL", "q:{web}:qe"); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "replicas of e11d6a0 connected (protocol 1)", take: true, bound: time.Minute, before: func(_ *testing.T, _ *redistest.Server, l *quota.Leases, _ *quota.Pool) {
			l.SpeakProtocol(1)
		}},
		{name: "past the fence", take: true, bound: time.Minute, before: func(t *testing.T, _ *redistest.Server, _ *quota.Leases, p *quota.Pool) {
			testutil.EventuallyWithin(t, 10*time.Second, "the lease past its fence", p.Fenced)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			// No Run: nothing renews, so the lease reaches its fence after hold − margin.
			l := quota.New(client(t, srv.Addr), "q:", "a", quota.WithCallTimeout(time.Second),
				quota.WithTTL(time.Second), quota.WithDegradedFor(time.Second))
			seed(t, l)
			p := l.Pool("web", "i1", cap200)
			if tc.take && !p.TryAcquire(context.Background()) {
				t.Fatal("no slot")
			}
			if tc.before != nil {
				tc.before(t, srv, l, p)
			}
			inUse := p.InFlight()
			err := p.Detach(context.Background(), tc.bound)
			if !errors.Is(err, quota.ErrNotDetached) {
				t.Fatalf("Detach: %v, want ErrNotDetached", err)
			}
			if got := p.InFlight(); got != inUse {
				t.Errorf("in use after a refused detach: %d, want %d", got, inUse)
			}
			if out, _ := srv.Do("EXISTS", "q:{web}:D:i1"); out != "0" {
				t.Errorf("a refused detach left a hold (EXISTS %s)", out)
			}
		})
	}
}
