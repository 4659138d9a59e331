package redissub_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/redissub"
)

// Follow delivers what is published while the subscription stands, says when it stands, and
// stands again by itself after redis-server was killed and restarted (reporting the failure).
func TestFollowSurvivesARedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var (
		mu        sync.Mutex
		got       []string
		subs      atomic.Int32
		failures  atomic.Int32
		ctx, stop = context.WithCancel(context.Background())
		done      = make(chan struct{})
	)
	go func() {
		defer close(done)
		redissub.Follow(ctx, c, "ch", redissub.Hooks{
			Message: func(m rueidis.PubSubMessage) {
				mu.Lock()
				got = append(got, m.Message)
				mu.Unlock()
			},
			Subscribed: func() { subs.Add(1) },
			Failed:     func(error) { failures.Add(1) },
		})
	}()
	received := func(msg string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) > 0 && got[len(got)-1] == msg
		}
	}
	publish := func(msg string) {
		t.Helper()
		if _, err := srv.Do("PUBLISH", "ch", msg); err != nil {
			t.Fatal(err)
		}
	}

	testutil.Eventually(t, "the subscription stands", func() bool { return subs.Load() == 1 })
	publish("one")
	testutil.Eventually(t, "the first message arrives", received("one"))

	srv.Kill()
	srv.Restart()
	testutil.Eventually(t, "the subscription stands again", func() bool { return subs.Load() >= 2 })
	if failures.Load() == 0 {
		t.Error("the broken subscription was not reported")
	}
	publish("two")
	testutil.Eventually(t, "a message after the restart arrives", received("two"))

	stop()
	<-done // Follow returns once ctx ends
}
