package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// A store call returns by its deadline even while the client reconnects to a Redis that
// accepts connections and never answers (a hung server, a blackholed network): rueidis makes
// every caller wait for the first caller's dial and handshake, which a background call without
// a deadline holds for the whole dial timeout (here an hour). Each Get must come back
// unavailable; on a client that waits, one stays stuck behind the background call's handshake.
func TestRedisCallReturnsByDeadlineWhileReconnectHangs(t *testing.T) {
	srv := redistest.Start(t)
	p := faultproxy.Start(t, srv.Addr)
	st := newRedisStore(t, redisstore.Config{Addrs: []string{p.Addr}, DialTimeout: time.Hour}, redisstore.WithOpTimeout(100*time.Millisecond))
	ctx := context.Background()
	if err := st.Client().Do(ctx, st.Client().B().Ping().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	p.Cut() // the connection breaks; reconnecting is refused until the blackhole
	testutil.Eventually(t, "the client sees the connection gone", func() bool {
		return st.Client().Do(ctx, st.Client().B().Ping().Build()).Error() != nil
	})
	p.Blackhole() // new connections are accepted and never answered
	t.Cleanup(p.Heal)
	bg, stop := context.WithCancel(ctx)
	defer stop()
	// Background loops without a deadline, on every connection of the client (it spreads
	// calls over several, by key slot and at random): they may own a reconnection for an hour.
	for range 4 {
		c := st.Client()
		go func() {
			for bg.Err() == nil {
				_ = c.Do(context.WithoutCancel(bg), c.B().Get().Key("{svc}bg").Build()).Error()
			}
		}()
		go func() {
			for bg.Err() == nil {
				_ = c.DoCache(context.WithoutCancel(bg), c.B().Hgetall().Key("{svc}bg").Cache(), time.Minute).Error()
			}
		}()
	}
	done := make(chan error, 1)
	go func() {
		for range 20 {
			if _, err := st.Get(ctx, "svc", sessiontest.RandomHex(t, 16)); !errors.Is(err, session.ErrStoreUnavailable) {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Get of an unknown session while Redis does not answer: %v; want ErrStoreUnavailable", err)
		}
	case <-time.After(time.Minute): // far beyond 20 × the 100 ms call timeout, far below the dial timeout
		t.Fatal("a Get stayed blocked behind another call's reconnection (its deadline was 100 ms)")
	}
}
