package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// The store's clock is Redis's.
//
// Every script that decides session, reservation or reaper expiry reads redis.call('TIME')
// (luaNow); no replica's "now" travels in a script's arguments, so a script queued during a
// stall decides on the time it runs at, and a replica whose wall clock is off changes no
// expiry. Scripts that read TIME and then write are safe from Redis 5 on: their effects, not
// the script, are replicated and written to the AOF (the only mode of Redis ≥ 7), so a replica
// or a replay never evaluates TIME again.
//
// What Go code decides about expiry (Get's view and the replica cache, the reaper's scan, the
// checks before a write) is on redisNow: Redis's TIME at the last sample plus the replica's
// monotonic time elapsed since. It does not depend on the replica's wall clock agreeing with
// Redis's, nor on it not stepping: in effect, a remaining TTL read from Redis is counted down on
// the replica's monotonic clock. A sample is taken at New and every clockSync by Run; the
// estimate lags Redis by at most the sample's round trip (it is anchored at the reply), so what
// Go finds lapsed has lapsed for Redis too, and the scripts re-check every expiry they act on
// (guards) against TIME. A write whose guard fails is decided again.
//
// Times callers hand in (Touch, End, the Created and LastSeen of a new session) are on the
// replica's clock (WithClock, the engine's): they are translated by the skew between that clock
// and Redis's measured at the sample. Sessions come out in Redis's time.
//
// Tests whose manual clock must move expiry (the conformance suite) run the store on it instead
// (WithManualClock): the scripts then take that time from their arguments.

// clockSync is how often Run samples Redis's clock.
const clockSync = 2 * time.Second

// clockSample is one reading of Redis's clock.
type clockSample struct {
	redis time.Time     // Redis's TIME
	mono  time.Time     // time.Now() when the reply came (its monotonic reading counts)
	skew  time.Duration // Redis's time minus the replica clock's, at the reply
	rtt   time.Duration
}

// WithManualClock runs the store on now instead of Redis's clock, in its scripts too, and
// makes it the replica's clock (WithClock): for tests that move time by hand. Never in
// production: replicas on manual clocks disagree.
func WithManualClock(now func() time.Time) Option {
	return func(r *Store) {
		if now != nil {
			r.clock, r.manual = now, true
		}
	}
}

// redisClock is the store's view of Redis's clock.
type redisClock struct {
	manual bool // the store runs on its clock option (WithManualClock)
	sample atomic.Pointer[clockSample]
}

// now is the store's time: Redis's, as estimated on this replica (see above).
func (r *Store) now() time.Time {
	if r.manual {
		return r.clock().UTC()
	}
	s := r.sample.Load()
	if s == nil {
		return r.clock().UTC() // Redis has not answered yet: nothing can be written either
	}
	return s.redis.Add(time.Since(s.mono)).UTC()
}

// fromReplica translates a time read on the replica's clock into Redis's.
func (r *Store) fromReplica(t time.Time) time.Time {
	if s := r.sample.Load(); s != nil && !r.manual {
		t = t.Add(s.skew)
	}
	return t.UTC()
}

// syncClock samples Redis's clock. A sample is kept unless the one held is fresher than a
// minute and was taken with a clearly shorter round trip (a slow answer is a worse estimate).
func (r *Store) syncClock(ctx context.Context) error {
	if r.manual {
		return nil
	}
	sent := time.Now()
	res, err := r.c.Do(ctx, r.c.B().Time().Build()).AsStrSlice()
	got := time.Now()
	if err := r.check(err); err != nil {
		return fmt.Errorf("reading Redis's clock: %w", err)
	}
	if len(res) != 2 {
		return fmt.Errorf("reading Redis's clock: unexpected reply %q", res)
	}
	sec, err1 := strconv.ParseInt(res[0], 10, 64)
	us, err2 := strconv.ParseInt(res[1], 10, 64)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("reading Redis's clock: unexpected reply %q", res)
	}
	redis := time.Unix(sec, us*int64(time.Microsecond))
	s := &clockSample{redis: redis, mono: got, skew: redis.Sub(r.clock()), rtt: got.Sub(sent)}
	if cur := r.sample.Load(); cur != nil && time.Since(cur.mono) < time.Minute && s.rtt > 2*cur.rtt+time.Millisecond {
		return nil
	}
	r.sample.Store(s)
	return nil
}

// scriptNow is a script's time argument: "" (the script reads TIME), or the manual clock's
// time in µs.
func (r *Store) scriptNow() string {
	if !r.manual {
		return ""
	}
	return strconv.FormatInt(r.clock().UnixMicro(), 10)
}

// luaNow sets now (µs since the epoch) from Redis's TIME, or from ARGV[1] when the store runs on
// a manual clock (scriptNow).
const luaNow = `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
`

// A guard makes a write conditional on Redis's clock (ARGV[2] kind, ARGV[3] µs): the check Go
// made on redisNow, made again by the script at the time it runs.
type guard struct {
	kind string // "": none; "L": the time has passed; "A": the time has not passed yet
	at   string
}

// lapsedBy guards a write that needs t to have passed (an expiry acted on): t is rounded down
// to the µs, so what Go found passed on the same clock passes.
func lapsedBy(t time.Time) guard {
	return guard{"L", strconv.FormatInt(t.UnixMicro(), 10)}
}

// aliveAt guards a write that needs t not to have passed yet (a session still live): t is
// rounded up to the µs, so what Go found not passed on the same clock passes.
func aliveAt(t time.Time) guard {
	us := t.UnixMicro()
	if t.Sub(time.UnixMicro(us)) > 0 {
		us++
	}
	return guard{"A", strconv.FormatInt(us, 10)}
}

// luaGuard returns failed from the script when its guard (ARGV[2], ARGV[3]) does not hold at
// now.
func luaGuard(failed string) string {
	return `
if ARGV[2] ~= '' then
  local g = tonumber(ARGV[3])
  if (ARGV[2] == 'L' and now < g) or (ARGV[2] == 'A' and now >= g) then return ` + failed + ` end
end
`
}
