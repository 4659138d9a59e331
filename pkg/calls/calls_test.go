package calls_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/calls"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestLifecycle(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	tr := calls.New(calls.WithClock(ck.now))
	mustBegin := func(inst, id string) {
		t.Helper()
		if got, err := tr.Begin("voice", inst, id); err != nil || got != inst {
			t.Fatalf("Begin(%s, %s) = %q, %v", inst, id, got, err)
		}
	}
	mustBegin("a", "c1")
	mustBegin("a", "c2")
	mustBegin("b", "c3")
	// A retransmitted INVITE asked again is not counted twice, and stays where it is.
	if got, err := tr.Begin("voice", "b", "c1"); err != nil || got != "a" {
		t.Fatalf("Begin again = %q, %v; want a, nil", got, err)
	}
	want := []calls.Load{{Instance: "a", Setup: 2}, {Instance: "b", Setup: 1}}
	if diff := cmp.Diff(want, tr.Loads("voice")); diff != "" {
		t.Fatalf("loads after 3 INVITEs (-want +got):\n%s", diff)
	}
	if _, err := tr.Answered("voice", "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Answered("voice", "c1"); err != nil { // a retransmitted 200
		t.Fatal(err)
	}
	want = []calls.Load{{Instance: "a", Setup: 1, Answered: 1}, {Instance: "b", Setup: 1}}
	if diff := cmp.Diff(want, tr.Loads("voice")); diff != "" {
		t.Fatalf("loads after one answer (-want +got):\n%s", diff)
	}
	if c, err := tr.Ended("voice", "c1"); err != nil || c.Instance != "a" || c.State != calls.Answered {
		t.Fatalf("Ended(c1) = %+v, %v", c, err)
	}
	if _, err := tr.Ended("voice", "c1"); !errors.Is(err, calls.ErrUnknownCall) {
		t.Fatalf("second Ended(c1) = %v, want ErrUnknownCall", err)
	}
	if _, err := tr.Answered("voice", "nope"); !errors.Is(err, calls.ErrUnknownCall) {
		t.Fatalf("Answered(unknown) = %v, want ErrUnknownCall", err)
	}
	if _, err := tr.Begin("voice", "", "x"); !errors.Is(err, calls.ErrInvalid) {
		t.Fatalf("Begin without instance = %v, want ErrInvalid", err)
	}
	if _, err := tr.Ended("voice", "c2"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Ended("voice", "c3"); err != nil {
		t.Fatal(err)
	}
	if got := tr.Loads("voice"); len(got) != 0 {
		t.Fatalf("loads after every call ended: %+v, want none", got)
	}
}

func TestExpiry(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	tr := calls.New(calls.WithClock(ck.now), calls.WithSetupTTL(time.Minute), calls.WithTTL(time.Hour))
	for _, id := range []string{"setup", "answered"} {
		if _, err := tr.Begin("voice", "a", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.Answered("voice", "answered"); err != nil {
		t.Fatal(err)
	}
	ck.advance(59 * time.Second)
	if got := tr.Expire(ck.now()); len(got) != 0 {
		t.Fatalf("expired before the setup TTL: %+v", got)
	}
	ck.advance(time.Second)
	got := tr.Expire(ck.now())
	if len(got) != 1 || got[0].CallID != "setup" {
		t.Fatalf("at the setup TTL expired %+v, want the unanswered call", got)
	}
	ck.advance(time.Hour - time.Minute - time.Second)
	if got := tr.Expire(ck.now()); len(got) != 0 {
		t.Fatalf("answered call expired before its TTL: %+v", got)
	}
	ck.advance(time.Second)
	if got := tr.Expire(ck.now()); len(got) != 1 || got[0].CallID != "answered" {
		t.Fatalf("at the TTL expired %+v, want the answered call", got)
	}
	if l := tr.Loads("voice"); len(l) != 0 {
		t.Fatalf("loads after expiry: %+v", l)
	}
}

func TestBounds(t *testing.T) {
	tr := calls.New(calls.WithMaxCalls(3))
	tr.SetCap("voice", 2)
	for i, want := range []error{nil, nil, calls.ErrCallCap} {
		if _, err := tr.Begin("voice", "a", fmt.Sprint("a", i)); !errors.Is(err, want) && (want != nil || err != nil) {
			t.Fatalf("call %d on a: %v, want %v", i, err, want)
		}
	}
	if _, err := tr.Begin("voice", "b", "b0"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Begin("other", "x", "x0"); !errors.Is(err, calls.ErrTooManyCalls) {
		t.Fatalf("4th call: %v, want ErrTooManyCalls", err)
	}
	// Ending a call frees its place under the cap.
	if _, err := tr.Ended("voice", "a0"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Begin("voice", "a", "a9"); err != nil {
		t.Fatalf("after an end: %v", err)
	}
	want := []calls.Load{{Instance: "a", Setup: 2, Cap: 2}, {Instance: "b", Setup: 1, Cap: 2}}
	if diff := cmp.Diff(want, tr.Loads("voice")); diff != "" {
		t.Fatalf("loads (-want +got):\n%s", diff)
	}
}

// TestCapUnderConcurrency: 200 goroutines place a call each on one instance with a cap of 50:
// exactly 50 are admitted. Then 200 goroutines churn (end one, place one) while a watcher
// reads the load: it never exceeds the cap, and every call is uncounted at the end.
func TestCapUnderConcurrency(t *testing.T) {
	tr := calls.New()
	tr.SetCap("voice", 50)
	var admitted atomic.Int64
	var ids sync.Map
	run := func(n int, body func(g int)) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range n {
			wg.Add(1)
			go func() { defer wg.Done(); <-start; body(g) }()
		}
		close(start)
		wg.Wait()
	}
	begin := func(id string) {
		if _, err := tr.Begin("voice", "a", id); err == nil {
			admitted.Add(1)
			ids.Store(id, true)
		} else if !errors.Is(err, calls.ErrCallCap) {
			t.Errorf("Begin: %v", err)
		}
	}
	run(200, func(g int) { begin(fmt.Sprint("first-", g)) })
	if admitted.Load() != 50 {
		t.Fatalf("200 concurrent calls, cap 50: %d admitted", admitted.Load())
	}
	stop := make(chan struct{})
	watched := make(chan int)
	go func() {
		peak := 0
		for {
			select {
			case <-stop:
				watched <- peak
				return
			default:
			}
			for _, l := range tr.Loads("voice") {
				peak = max(peak, l.Total())
			}
		}
	}()
	run(200, func(g int) {
		for i := range 10 {
			ids.Range(func(k, _ any) bool {
				if _, err := tr.Ended("voice", k.(string)); err == nil {
					ids.Delete(k)
					return false
				}
				return true
			})
			begin(fmt.Sprintf("churn-%d-%d", g, i))
		}
	})
	close(stop)
	if peak := <-watched; peak > 50 {
		t.Fatalf("load peaked at %d calls, cap 50", peak)
	}
	ids.Range(func(k, _ any) bool {
		if _, err := tr.Ended("voice", k.(string)); err != nil {
			t.Errorf("Ended(%v): %v", k, err)
		}
		return true
	})
	if l := tr.Loads("voice"); len(l) != 0 {
		t.Fatalf("loads after all ended: %+v", l)
	}
}

// TestPerServiceLimits: a service's own TTL overrides the tracker's; another service keeps the
// tracker's.
func TestPerServiceLimits(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	tr := calls.New(calls.WithClock(ck.now), calls.WithSetupTTL(time.Hour))
	tr.SetLimits("fast", calls.Limits{SetupTTL: time.Minute, Cap: 3})
	for _, svc := range []string{"fast", "slow"} {
		if _, err := tr.Begin(svc, "a", "c"); err != nil {
			t.Fatal(err)
		}
	}
	if l := tr.Loads("fast"); len(l) != 1 || l[0].Cap != 3 {
		t.Fatalf("fast loads %+v, want cap 3", l)
	}
	ck.advance(time.Minute)
	got := tr.Expire(ck.now())
	if len(got) != 1 || got[0].Service != "fast" {
		t.Fatalf("after a minute expired %+v, want only the fast service's call", got)
	}
}
