// Package sessiontest holds shared test fixtures for pkg/session: a manual clock, session
// builders, a MemStore constructor and a conformance suite that any session.Store (the
// in-memory one today, a shared backend later) must pass.
package sessiontest

import (
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// Start is the time NewClock fixtures start at when given the zero time.
func Start() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// Clock is a manual clock for WithClock. Its zero value is not usable; use NewClock. Safe for
// concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at start (Start() if start is zero).
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = Start()
	}
	return &Clock{now: start}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Session returns a cookie session (service, id) on instance with the default limits of a
// service (TTL 6h, idle timeout 30m). Times are left zero so the store fills them in.
func Session(service, id, instance string) session.Session {
	return session.Session{
		ID:          id,
		Service:     service,
		Instance:    instance,
		Kind:        session.KindCookie,
		TTL:         6 * time.Hour,
		IdleTimeout: 30 * time.Minute,
	}
}

// NewMemStore returns an empty MemStore reading time from a new manual clock started at
// Start(), plus that clock. opts are applied after the clock option.
func NewMemStore(tb testing.TB, opts ...session.Option) (*session.MemStore, *Clock) {
	tb.Helper()
	clock := NewClock(time.Time{})
	return session.NewMemStore(append([]session.Option{session.WithClock(clock.Now)}, opts...)...), clock
}
