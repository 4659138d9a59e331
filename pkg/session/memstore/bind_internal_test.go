package memstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
)

// TestBindingsFollowRecords: records share interned (instance, TTL, idle timeout) bindings;
// an Update that changes any of them moves the record to another binding, Get reports what
// was stored, and once every record is purged no instance or binding is left behind.
func TestBindingsFollowRecords(t *testing.T) {
	ctx := t.Context()
	clock := testutil.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st := New(WithClock(clock.Now), WithRetention(time.Minute))
	limits := []struct{ ttl, idle time.Duration }{{time.Hour, 0}, {time.Hour, time.Minute}, {2 * time.Hour, time.Minute}}
	want := map[string]session.Session{}
	for i := range 60 {
		l := limits[i%len(limits)]
		s := session.Session{ID: fmt.Sprintf("s%02d", i), Service: "web", Instance: []string{"a", "b"}[i%2], Kind: session.KindCookie,
			TTL: l.ttl, IdleTimeout: l.idle}
		if err := st.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		want[s.ID] = s
	}
	for i := 0; i < 60; i += 4 {
		id := fmt.Sprintf("s%02d", i)
		s, err := st.Update(ctx, "web", id, func(s *session.Session) error {
			s.TTL, s.IdleTimeout, s.Instance = 3*time.Hour+time.Duration(i), 0, "c"
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want[id] = s
	}
	st.namesMu.Lock()
	binds := 0
	for _, g := range st.groups {
		binds += len(g.binds)
	}
	st.namesMu.Unlock()
	// a and b each keep the three limits; c holds one binding per distinct updated TTL.
	if wantBinds := 2*len(limits) + 15; binds != wantBinds {
		t.Errorf("%d bindings, want %d", binds, wantBinds)
	}
	for id, w := range want {
		got, err := st.Get(ctx, "web", id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Instance != w.Instance || got.TTL != w.TTL || got.IdleTimeout != w.IdleTimeout {
			t.Errorf("Get(%s) = %s, %v, %v; want %s, %v, %v", id, got.Instance, got.TTL, got.IdleTimeout, w.Instance, w.TTL, w.IdleTimeout)
		}
		if _, err := st.End(ctx, "web", id, session.StatusTerminated, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Minute)
	if _, purged, err := st.Reap(ctx); err != nil || purged != len(want) {
		t.Fatalf("Reap purged %d, %v; want %d", purged, err, len(want))
	}
	st.namesMu.Lock()
	defer st.namesMu.Unlock()
	if len(st.groups) != 0 {
		t.Errorf("%d instances left after every record was purged", len(st.groups))
	}
}
