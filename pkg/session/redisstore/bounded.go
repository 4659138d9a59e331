package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// maxAbandoned bounds the calls a boundedClient has stopped waiting for and that still wait in
// rueidis: past it, a call with a deadline fails at once (Redis is hung; each such call holds a
// goroutine until rueidis gives up on the connection, at most the dial timeout).
const maxAbandoned = 4096

// errAbandonedCalls is returned, as a timeout (so that the caller treats Redis as slow, not
// gone), while maxAbandoned calls are still stuck.
var errAbandonedCalls = fmt.Errorf("redis store: too many calls still waiting for a hung Redis: %w", context.DeadlineExceeded)

// boundedClient makes every call that has a deadline return by it. rueidis honours a call's
// ctx while the call is queued or in flight on a connection, but not while it waits for
// another caller's reconnection: mux waits for the dial and handshake (HELLO, CLIENT
// TRACKING) of the first caller, bounded only by that caller's ctx or the dial timeout. On a
// hung Redis (SIGSTOP, a frozen VM) the TCP connect succeeds and HELLO never answers, so
// every call behind it waited up to the dial timeout (5 s; a decision was measured at 3.4 s).
// Here the call runs on its own goroutine and the caller stops waiting at its deadline; the
// goroutine ends when rueidis does. Calls without a deadline (background loops bounded by
// their own means) run as they are.
type boundedClient struct {
	rueidis.Client
	abandoned atomic.Int64 // calls given up on that rueidis still holds
}

func (c *boundedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return bounded(c, ctx, func() rueidis.RedisResult { return c.Client.Do(ctx, cmd) }, rueidis.NewErrorResult)
}

func (c *boundedClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	return bounded(c, ctx, func() rueidis.RedisResult { return c.Client.DoCache(ctx, cmd, ttl) }, rueidis.NewErrorResult)
}

func (c *boundedClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	return bounded(c, ctx, func() []rueidis.RedisResult { return c.Client.DoMulti(ctx, multi...) }, errResults(len(multi)))
}

func (c *boundedClient) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	return bounded(c, ctx, func() []rueidis.RedisResult { return c.Client.DoMultiCache(ctx, multi...) }, errResults(len(multi)))
}

// errResults returns a failure of n results, each with the error.
func errResults(n int) func(error) []rueidis.RedisResult {
	return func(err error) []rueidis.RedisResult {
		out := make([]rueidis.RedisResult, n)
		for i := range out {
			out[i] = rueidis.NewErrorResult(err)
		}
		return out
	}
}

// bounded returns call's result, or fail(ctx's error) once ctx is done first (call goes on,
// abandoned, on its own goroutine).
func bounded[T any](c *boundedClient, ctx context.Context, call func() T, fail func(error) T) T {
	if _, ok := ctx.Deadline(); !ok {
		return call()
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if c.abandoned.Load() >= maxAbandoned {
		return fail(errAbandonedCalls)
	}
	const running, finished, abandoned = 0, 1, 2
	var state atomic.Int32
	done := make(chan T, 1)
	go func() {
		done <- call()
		if !state.CompareAndSwap(running, finished) { // the caller left: it counted this call
			c.abandoned.Add(-1)
		}
	}()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		c.abandoned.Add(1)
		if state.CompareAndSwap(running, abandoned) {
			return fail(ctx.Err())
		}
		c.abandoned.Add(-1) // it finished meanwhile
		return <-done
	}
}
