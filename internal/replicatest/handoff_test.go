package replicatest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestDecisionHandOffOnSharedSlots: replica a hands off both exchanges of an instance with two
// request slots (Decision.HandOff) and stops. With the service's maxLifetime set, the slots
// stay taken — replica b is refused — until that bound from each exchange's start (plus the
// margin) has passed, then b is admitted. Without one (unbounded), HandOff refuses: the
// exchanges stay a's, and their slots come back when they end.
func TestDecisionHandOffOnSharedSlots(t *testing.T) {
	const lifetime = 3 * time.Second
	for _, tc := range []struct {
		name     string
		lifetime time.Duration
	}{
		{"bounded: held until maxLifetime", lifetime},
		{"unbounded: refused", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			svc := benchService(100)
			svc.RequestSlotsPerInstance = 2
			svc.MaxLifetime = tc.lifetime
			reps := replicatest.Start(t, srv.Addr, 2, []registry.Service{svc}, affinitytest.Instances("fn", 1), replicatest.Options{LeaseTTL: time.Second})
			a, b := reps[0], reps[1]
			var held []affinity.Decision
			start := time.Now()
			for range 2 {
				d, err := decide(a.Engine, "")
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, d)
			}
			var handOffErr error
			for _, d := range held {
				handOffErr = errors.Join(handOffErr, d.HandOff(context.Background()))
			}
			if _, err := decide(b.Engine, ""); err == nil {
				t.Fatal("b admitted an exchange while both slots were handed off or held")
			}
			if tc.lifetime == 0 {
				if !errors.Is(handOffErr, quota.ErrNotDetached) {
					t.Fatalf("HandOff of an unbounded exchange: %v, want ErrNotDetached", handOffErr)
				}
				for _, d := range held {
					d.End()
				}
				testutil.EventuallyWithin(t, 30*time.Second, "b admitted once a's exchanges ended", func() bool {
					d, err := decide(b.Engine, "")
					if err == nil {
						d.End()
					}
					return err == nil
				})
				return
			}
			if handOffErr != nil {
				t.Fatalf("HandOff: %v", handOffErr)
			}
			a.Stop() // its lease record cleared: the holds are their own
			var admittedAt time.Time
			testutil.EventuallyWithin(t, 30*time.Second, "b admitted once the holds expired", func() bool {
				d, err := decide(b.Engine, "")
				if err != nil {
					return false
				}
				admittedAt = time.Now()
				d.End()
				return true
			})
			if took := admittedAt.Sub(start); took < lifetime {
				t.Errorf("b admitted %v after the exchanges started, before their maxLifetime %v", took, lifetime)
			}
		})
	}
}
