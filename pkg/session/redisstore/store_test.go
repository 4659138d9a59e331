package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// newRedisStore returns a Store on srv under a key prefix of its own, so the subtests of
// one server never see each other's keys, and closes it at cleanup.
func newRedisStore(t *testing.T, cfg redisstore.Config, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	cfg.KeyPrefix = "t" + sessiontest.RandomHex(t, 6) + ":"
	st, err := redisstore.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func TestRedisStoreConformance(t *testing.T) {
	srv := redistest.Start(t)
	sessiontest.RunConformance(t, func(t *testing.T, clock *testutil.Clock) session.Store {
		return newRedisStore(t, redisstore.Config{Addrs: []string{srv.Addr}}, redisstore.WithManualClock(clock.Now))
	})
}

func TestRedisStoreConformanceOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := redistest.StartCluster(t)
	sessiontest.RunConformance(t, func(t *testing.T, clock *testutil.Clock) session.Store {
		return newRedisStore(t, redisstore.Config{Addrs: c.Addrs()}, redisstore.WithManualClock(clock.Now))
	})
}

func TestRedisStoreSharedConformance(t *testing.T) {
	srv := redistest.Start(t)
	sessiontest.RunSharedConformance(t, func(t *testing.T, clock *testutil.Clock) (session.Store, session.Store) {
		cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
		return runRedisStore(t, cfg, clock), runRedisStore(t, cfg, clock)
	})
}

// replicaHandles runs n handles on one new redis-server under one fresh key prefix (n replicas
// of one fleet), all on one clock starting at sessiontest.Start.
func replicaHandles(t *testing.T, n int) ([]*redisstore.Store, *testutil.Clock) {
	t.Helper()
	srv := redistest.Start(t)
	clock := testutil.NewClock(sessiontest.Start())
	cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	handles := make([]*redisstore.Store, n)
	for i := range handles {
		handles[i] = runRedisStore(t, cfg, clock)
	}
	return handles, clock
}

// runRedisStore opens a handle with cfg (its prefix kept) and runs it until the test ends.
func runRedisStore(t *testing.T, cfg redisstore.Config, clock *testutil.Clock, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	st, err := redisstore.New(cfg, append([]redisstore.Option{redisstore.WithManualClock(clock.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = st.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; st.Close() })
	select {
	case <-st.Subscribed():
	case <-time.After(10 * time.Second):
		t.Fatal("the store did not subscribe to end notifications")
	}
	return st
}
