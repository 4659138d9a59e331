package balance_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/balance"
)

// observer tracks the number of requests a test believes are in flight and the maximum it saw.
type observer struct {
	inflight, max atomic.Int64
}

func (o *observer) enter() {
	n := o.inflight.Add(1)
	for {
		m := o.max.Load()
		if n <= m || o.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (o *observer) leave() { o.inflight.Add(-1) }

func TestSlotsRequestCapExactUnderContention(t *testing.T) {
	const goroutines, reqCap = 1000, 200
	s := balance.NewSlots(2, reqCap)
	var obs observer
	var admitted atomic.Int64
	var tried, done sync.WaitGroup
	start := make(chan struct{})
	release := make(chan struct{})
	tried.Add(goroutines)
	done.Add(goroutines)
	for range goroutines {
		go func() {
			defer done.Done()
			<-start
			tk, ok := s.TryAcquireRequest(context.Background())
			if ok {
				obs.enter()
				admitted.Add(1)
			}
			tried.Done()
			if !ok {
				return
			}
			<-release // hold the slot until every goroutine has tried
			obs.leave()
			if !tk.Release() {
				t.Error("first Release returned false")
			}
		}()
	}
	close(start)
	tried.Wait()
	if got := admitted.Load(); got != reqCap {
		t.Errorf("admitted while all hold = %d, want exactly %d", got, reqCap)
	}
	if got := s.Requests(); got != reqCap {
		t.Errorf("Requests() while all hold = %d, want %d", got, reqCap)
	}
	if _, ok := s.TryAcquireRequest(context.Background()); ok {
		t.Errorf("request %d admitted with cap %d", reqCap+1, reqCap)
	}
	close(release)
	done.Wait()
	if got := obs.max.Load(); got > reqCap {
		t.Errorf("max observed in flight = %d, want ≤ %d", got, reqCap)
	}
	if got := s.Requests(); got != 0 {
		t.Errorf("Requests() after all released = %d, want 0", got)
	}
}

func TestSlotsRequestHammer(t *testing.T) {
	const goroutines, reqCap, rounds = 1000, 200, 20
	s := balance.NewSlots(1, reqCap)
	var obs observer
	var admitted, rejected atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range rounds {
				tk, ok := s.TryAcquireRequest(context.Background())
				if !ok {
					rejected.Add(1)
					continue
				}
				admitted.Add(1)
				obs.enter()
				if n := s.Requests(); n > reqCap || n < 1 {
					t.Errorf("Requests() = %d while holding a slot", n)
				}
				time.Sleep(50 * time.Microsecond) // hold the slot so that the cap is reached
				obs.leave()
				if !tk.Release() {
					t.Error("first Release returned false")
				}
				if tk.Release() {
					t.Error("second Release returned true")
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("admitted %d, rejected %d, max observed in flight %d", admitted.Load(), rejected.Load(), obs.max.Load())
	if got := obs.max.Load(); got > reqCap {
		t.Errorf("max observed in flight = %d, want ≤ %d", got, reqCap)
	}
	// A rejection happens only at the cap, so rejections prove the cap was reached; the
	// observer's own count trails the slots (it enters after acquiring) and is no such proof.
	if rejected.Load() == 0 {
		t.Errorf("the hammer never pressed the cap (rejected %d, max in flight %d)", rejected.Load(), obs.max.Load())
	}
	if admitted.Load()+rejected.Load() != goroutines*rounds {
		t.Errorf("admitted+rejected = %d, want %d", admitted.Load()+rejected.Load(), goroutines*rounds)
	}
	if got := s.Requests(); got != 0 {
		t.Errorf("Requests() after the hammer = %d, want 0", got)
	}
}

func TestTicketReleaseExactlyOnceConcurrently(t *testing.T) {
	s := balance.NewSlots(1, 3)
	keep, _ := s.TryAcquireRequest(context.Background()) // a second holder proves the count does not underflow into it
	tk, ok := s.TryAcquireRequest(context.Background())
	if !ok {
		t.Fatal("TryAcquireRequest failed on an empty instance")
	}
	var trues atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tk.Release() {
				trues.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := trues.Load(); got != 1 {
		t.Errorf("Release returned true %d times, want 1", got)
	}
	if !tk.Released() {
		t.Error("Released() = false after Release")
	}
	if got := s.Requests(); got != 1 {
		t.Errorf("Requests() = %d, want 1 (the other holder)", got)
	}
	keep.Release()
	if keep.Release() {
		t.Error("second Release returned true")
	}
	if got := s.Requests(); got != 0 {
		t.Errorf("Requests() = %d, want 0", got)
	}
	var nilTicket *balance.Ticket
	if nilTicket.Release() {
		t.Error("nil Ticket Release returned true")
	}
}

// Seed scenario 2: two sessions share one instance's 200 request slots; the 201st concurrent
// request is refused, and a released slot admits the next one.
func TestSlotsSeedScenario2(t *testing.T) {
	s := balance.NewSlots(2, 200)
	for client := range 2 {
		if !s.TryAcquireSession() {
			t.Fatalf("session for client %d refused", client+1)
		}
	}
	if s.TryAcquireSession() {
		t.Fatal("third session admitted with 2 sessions per instance")
	}
	tickets := make([]*balance.Ticket, 0, 200)
	for i := range 200 {
		tk, ok := s.TryAcquireRequest(context.Background())
		if !ok {
			t.Fatalf("request %d refused", i+1)
		}
		tickets = append(tickets, tk)
	}
	if _, ok := s.TryAcquireRequest(context.Background()); ok {
		t.Fatal("request 201 admitted (want the 429 outcome)")
	}
	tickets[0].Release()
	tk, ok := s.TryAcquireRequest(context.Background())
	if !ok {
		t.Fatal("request refused after a slot was released")
	}
	tk.Release()
	for _, tk := range tickets {
		tk.Release()
	}
	if got := s.Requests(); got != 0 {
		t.Errorf("Requests() = %d, want 0", got)
	}
}

func TestSlotsSessions(t *testing.T) {
	t.Run("cap holds under contention", func(t *testing.T) {
		s := balance.NewSlots(5, 1)
		var got atomic.Int64
		var wg sync.WaitGroup
		for range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s.TryAcquireSession() {
					got.Add(1)
				}
			}()
		}
		wg.Wait()
		if got.Load() != 5 || s.Sessions() != 5 {
			t.Errorf("admitted %d sessions, Sessions() = %d, want 5 and 5", got.Load(), s.Sessions())
		}
	})
	t.Run("release never goes negative", func(t *testing.T) {
		s := balance.NewSlots(2, 1)
		s.TryAcquireSession()
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() { defer wg.Done(); s.ReleaseSession() }()
		}
		wg.Wait()
		if got := s.Sessions(); got != 0 {
			t.Errorf("Sessions() = %d, want 0", got)
		}
		first, second, third := s.TryAcquireSession(), s.TryAcquireSession(), s.TryAcquireSession()
		if !first || !second || third {
			t.Errorf("after over-release three TryAcquireSession = %v, %v, %v, want true, true, false (cap 2); Sessions() = %d",
				first, second, third, s.Sessions())
		}
	})
	t.Run("AddSessions counts above the cap", func(t *testing.T) {
		s := balance.NewSlots(2, 1)
		s.AddSessions(3)
		s.AddSessions(-4) // ignored
		if got := s.Sessions(); got != 3 {
			t.Fatalf("Sessions() = %d, want 3", got)
		}
		if s.TryAcquireSession() {
			t.Fatal("session admitted at 3/2")
		}
		s.ReleaseSession()
		if s.TryAcquireSession() {
			t.Fatal("session admitted at 2/2")
		}
		s.ReleaseSession()
		if !s.TryAcquireSession() {
			t.Fatal("session refused at 1/2")
		}
	})
}

func TestSlotsSetCapsAppliesToFutureAcquisitions(t *testing.T) {
	s := balance.NewSlots(4, 4)
	var held []*balance.Ticket
	for range 4 {
		tk, ok := s.TryAcquireRequest(context.Background())
		if !ok {
			t.Fatal("request refused under the cap")
		}
		held = append(held, tk)
		s.TryAcquireSession()
	}
	s.SetCaps(2, 2)
	if sc, rc := s.Caps(); sc != 2 || rc != 2 {
		t.Fatalf("Caps() = %d, %d, want 2, 2", sc, rc)
	}
	if s.Requests() != 4 || s.Sessions() != 4 {
		t.Fatalf("lowering the caps revoked slots: requests %d sessions %d", s.Requests(), s.Sessions())
	}
	if _, ok := s.TryAcquireRequest(context.Background()); ok {
		t.Fatal("request admitted above the lowered cap")
	}
	held[0].Release()
	held[1].Release()
	if _, ok := s.TryAcquireRequest(context.Background()); ok {
		t.Fatal("request admitted at 2 in flight with cap 2")
	}
	held[2].Release()
	tk, ok := s.TryAcquireRequest(context.Background())
	if !ok {
		t.Fatal("request refused at 1 in flight with cap 2")
	}
	tk.Release()
	s.SetCaps(10, 10)
	if !s.TryAcquireSession() {
		t.Fatal("session refused after raising the cap")
	}
	held[3].Release()
}
