package balance_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/balance"
)

// detachPool is a shared pool of this process's counts whose Detach moves a slot in use to
// holds, or fails with fail; with gate set, Detach closes entered and waits for gate to close
// first.
type detachPool struct {
	mu      sync.Mutex
	inUse   int
	holds   int
	fail    error
	entered chan struct{}
	gate    chan struct{}
}

func (p *detachPool) TryAcquire(context.Context) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse++
	return true
}

func (p *detachPool) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
}

func (p *detachPool) InFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse
}

func (p *detachPool) Detach(_ context.Context, _ time.Duration) error {
	if p.gate != nil {
		close(p.entered)
		<-p.gate
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	p.inUse--
	p.holds++
	return nil
}

type poolCounts struct{ InUse, Holds int }

// TestTicketDetach: a detached slot is counted once — in use here or held by the pool, never
// both, never neither — whether Detach succeeds or fails and whether Release is called
// during it; a Release after Detach changes nothing.
func TestTicketDetach(t *testing.T) {
	refused := errors.New("refused")
	for _, tc := range []struct {
		name            string
		fail            error
		releaseDuring   bool
		wantErr         error
		wantRelease     bool // what the Release after Detach returns
		afterDetach     poolCounts
		afterAllRelease poolCounts
	}{
		{name: "detached", afterDetach: poolCounts{0, 1}, afterAllRelease: poolCounts{0, 1}},
		{name: "refused keeps the slot", fail: refused, wantErr: refused, wantRelease: true,
			afterDetach: poolCounts{1, 0}, afterAllRelease: poolCounts{0, 0}},
		{name: "released during a detach that succeeds", releaseDuring: true, afterDetach: poolCounts{0, 1}, afterAllRelease: poolCounts{0, 1}},
		{name: "released during a detach that fails", fail: refused, releaseDuring: true, wantErr: refused,
			afterDetach: poolCounts{0, 0}, afterAllRelease: poolCounts{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &detachPool{fail: tc.fail}
			s := balance.NewSharedSlots(10, 10, p, func() int { return 0 })
			tk, ok := s.TryAcquireRequest(context.Background())
			if !ok {
				t.Fatal("no slot")
			}
			var released chan bool
			if tc.releaseDuring {
				p.gate, p.entered = make(chan struct{}), make(chan struct{})
				released = make(chan bool, 1)
				go func() {
					// Release while Detach waits at the gate: it must not give the slot back yet.
					<-p.entered
					released <- tk.Release()
					close(p.gate)
				}()
			}
			err := tk.Detach(context.Background(), time.Minute)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Detach: %v, want %v", err, tc.wantErr)
			}
			if released != nil && !<-released {
				t.Error("the first Release, during Detach, returned false")
			}
			p.mu.Lock()
			got := poolCounts{p.inUse, p.holds}
			p.mu.Unlock()
			if d := cmp.Diff(tc.afterDetach, got); d != "" {
				t.Errorf("after Detach (-want +got):\n%s", d)
			}
			if r := tk.Release(); r != (tc.wantRelease && !tc.releaseDuring) {
				t.Errorf("Release after Detach = %v", r)
			}
			p.mu.Lock()
			got = poolCounts{p.inUse, p.holds}
			p.mu.Unlock()
			if d := cmp.Diff(tc.afterAllRelease, got); d != "" {
				t.Errorf("after Release (-want +got):\n%s", d)
			}
		})
	}
}

// TestTicketDetachOwnCounters: with this process's own counters Detach releases the slot
// (the counts end with the process); a second Detach or Release does nothing.
func TestTicketDetachOwnCounters(t *testing.T) {
	s := balance.NewSlots(10, 1)
	tk, ok := s.TryAcquireRequest(context.Background())
	if !ok {
		t.Fatal("no slot")
	}
	if err := tk.Detach(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := s.Requests(); got != 0 {
		t.Errorf("requests after Detach: %d, want 0", got)
	}
	if err := tk.Detach(context.Background(), time.Minute); !errors.Is(err, balance.ErrDetached) {
		t.Errorf("second Detach: %v, want ErrDetached", err)
	}
	if tk.Release() {
		t.Error("Release after Detach returned true")
	}
}
