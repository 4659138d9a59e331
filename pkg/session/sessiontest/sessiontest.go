// Package sessiontest holds shared test fixtures for pkg/session: a manual clock, session
// builders, a memstore constructor and the conformance suites that every session.Store
// (pkg/session/memstore, pkg/session/redisstore) must pass.
package sessiontest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// Start is the time the fixtures' clocks start at.
func Start() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

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

// NewMemStore returns an empty memstore.Store reading time from a new manual clock started at
// Start(), plus that clock. opts are applied after the clock option.
func NewMemStore(tb testing.TB, opts ...memstore.Option) (*memstore.Store, *testutil.Clock) {
	tb.Helper()
	clock := testutil.NewClock(Start())
	return memstore.New(append([]memstore.Option{memstore.WithClock(clock.Now)}, opts...)...), clock
}

// RandomHex returns n random bytes as hex (for key prefixes and ids unique to a test).
func RandomHex(tb testing.TB, n int) string {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}
