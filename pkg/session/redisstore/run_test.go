package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session/redisstore"
)

// Run's loop keeps going while Redis hangs (SIGSTOP): each iteration's calls (the touch flush,
// the reaper's lease and step, the clock reading) end by the loop's bound, so the next tick runs
// and fails again, instead of the first call waiting for an answer that never comes (here the
// dial timeout, which bounds a call without a deadline, is an hour). When Redis answers again,
// the touch made during the hang is flushed and the loop stops failing.
func TestRunKeepsGoingWhileRedisHangs(t *testing.T) {
	srv := redistest.Start(t)
	st := newRedisStore(t, redisstore.Config{Addrs: []string{srv.Addr}, DialTimeout: time.Hour},
		redisstore.WithOpTimeout(time.Second), redisstore.WithTouchDelay(50*time.Millisecond),
		redisstore.WithReapInterval(50*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = st.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	s := testSession(t, "i1")
	if err := st.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	created, err := st.Get(ctx, s.Service, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	<-st.Subscribed()

	srv.Pause()
	t.Cleanup(srv.Resume)
	st.Touch(ctx, s.Service, s.ID, time.Now()) // pending: every flush during the hang tries it
	n0 := st.UnavailableCount()
	const failures = 4 // iterations that came back, failed, while Redis hung
	testutil.EventuallyWithin(t, time.Minute, "Run's iterations failing one after another while Redis hangs", func() bool {
		return st.UnavailableCount() >= n0+failures
	})

	srv.Resume()
	testutil.Eventually(t, "the touch made during the hang flushed once Redis answers", func() bool {
		seen, err := srv.Do("HGET", st.KeyPrefix()+"{svc}:s:"+s.ID, "seen") // what Redis holds
		n, perr := strconv.ParseInt(strings.TrimSpace(seen), 10, 64)
		return err == nil && perr == nil && n > created.LastSeen.UnixNano()
	})
}
