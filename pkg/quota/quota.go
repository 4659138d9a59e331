// Package quota shares each instance's request slots among tether replicas with leases on
// Redis (Doorman-style), so that requestSlotsPerInstance holds across every replica together
// without a store round trip per request.
//
// # How
//
// Each replica holds a lease of some of an instance's slots, recorded in Redis under the
// instance's service hash tag (P{svc}:L:<inst>: replica → slots; P{svc}:lx: expiry of each
// lease). A Lua script grants a borrow only from what the other live leases leave of the cap,
// so Σ leases ≤ cap at every instant. A request is admitted locally while the replica's slots in
// use are below its lease (one compare-and-swap: no round trip). When its lease is used up the
// replica borrows another chunk (one round trip, only then); when a lease sits idle the excess
// goes back, so slots flow to the replicas that need them. Leases are renewed every TTL/3 and
// expire after the TTL: a dead replica's slots come back to the others within the TTL.
//
// # Faults
//
//   - Redis unreachable: the replica keeps admitting within the lease it holds, until that
//     lease's TTL has passed since its last renewal; then it admits nothing new (429) until
//     Redis answers again — by then Redis may have handed the slots to other replicas, so
//     spending them would break the cap. Recovery is automatic at the next borrow or renewal.
//   - A replica killed: its leases expire after the TTL; until then its slots stay taken (the
//     others see 429 earlier than with one process). Requests it had admitted were reset by
//     Envoy with its side streams.
//   - A partition longer than the TTL with requests still in flight on the cut-off replica:
//     those requests keep running while Redis lends their slots again, so the cap can be
//     exceeded by them until they end. Every replica's clock must agree (NTP): lease expiry is
//     judged on the borrower's clock.
package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/balance"
	"github.com/tether-dev/tether/pkg/registry"
)

// Defaults of the Leases options.
const (
	DefaultTTL     = 10 * time.Second
	DefaultChunk   = 16
	denyBackoff    = 50 * time.Millisecond
	borrowTimeout  = time.Second
	returnInterval = 250 * time.Millisecond
)

// leaseScript borrows (delta > 0), returns (delta < 0) or renews (delta 0) this replica's lease
// of one instance's slots, after dropping every expired lease of the instance.
//
//	KEYS: P{svc}:L:<inst>, P{svc}:lx
//	ARGV: replica, instance, delta, cap, now (ms), ttl (ms)
//
// It returns {granted delta, this replica's lease after the change}.
var leaseScript = rueidis.NewLuaScript(`
local me, inst = ARGV[1], ARGV[2]
local delta, cap, now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local f = redis.call('HGETALL', KEYS[1])
local sum = 0
for i = 1, #f, 2 do
  local m = inst .. '|' .. f[i]
  local exp = redis.call('ZSCORE', KEYS[2], m)
  if (not exp) or tonumber(exp) <= now then
    redis.call('HDEL', KEYS[1], f[i])
    redis.call('ZREM', KEYS[2], m)
  else
    sum = sum + tonumber(f[i + 1])
  end
end
local mine = tonumber(redis.call('HGET', KEYS[1], me) or '0')
if delta > 0 then
  delta = math.max(0, math.min(delta, cap - sum))
elseif delta < 0 then
  delta = math.max(delta, -mine)
end
mine = mine + delta
local m = inst .. '|' .. me
if mine > 0 then
  redis.call('HSET', KEYS[1], me, mine)
  redis.call('ZADD', KEYS[2], now + ttl, m)
else
  redis.call('HDEL', KEYS[1], me)
  redis.call('ZREM', KEYS[2], m)
end
return {delta, mine}
`)

// Leases is one replica's view of the shared request slots. Safe for concurrent use.
type Leases struct {
	c       rueidis.Client
	prefix  string
	replica string
	ttl     time.Duration
	chunk   int
	log     *slog.Logger
	now     func() time.Time

	mu    sync.Mutex
	pools map[poolKey]*Pool
}

type poolKey struct{ service, instance string }

// Option configures Leases.
type Option func(*Leases)

// WithTTL sets the lease time to live (default DefaultTTL): how long a dead replica's slots
// stay taken, and how long a replica cut off from Redis keeps spending its lease.
func WithTTL(d time.Duration) Option {
	return func(l *Leases) {
		if d > 0 {
			l.ttl = d
		}
	}
}

// WithChunk sets how many slots one borrow asks for (default DefaultChunk); an idle lease
// keeps one chunk and returns the rest.
func WithChunk(n int) Option {
	return func(l *Leases) {
		if n > 0 {
			l.chunk = n
		}
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(lg *slog.Logger) Option {
	return func(l *Leases) {
		if lg != nil {
			l.log = lg
		}
	}
}

// New returns the leases of replica (a name unique among the replicas sharing the Redis, e.g.
// a random id per process) with keys under prefix (the session store's key prefix).
func New(c rueidis.Client, prefix, replica string, opts ...Option) *Leases {
	l := &Leases{c: c, prefix: prefix, replica: replica, ttl: DefaultTTL, chunk: DefaultChunk,
		log: slog.New(slog.DiscardHandler), now: time.Now, pools: map[poolKey]*Pool{}}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Pool returns the pool of one instance's request slots; capFn returns the cap in force (read
// at every borrow). The same pool is returned for the same instance.
func (l *Leases) Pool(service, instance string, capFn func() int) *Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := poolKey{service, instance}
	if p := l.pools[k]; p != nil {
		p.capFn.Store(&capFn)
		return p
	}
	tag := l.prefix + "{" + service + "}"
	p := &Pool{l: l, instance: instance, keys: []string{tag + ":L:" + instance, tag + ":lx"}}
	p.capFn.Store(&capFn)
	l.pools[k] = p
	return p
}

// Run renews the leases every TTL/3 and returns idle excess every 250 ms until ctx ends; then
// it returns every lease (so the other replicas get the slots at once) and returns nil.
func (l *Leases) Run(ctx context.Context) error {
	renew := time.NewTicker(l.ttl / 3)
	defer renew.Stop()
	ret := time.NewTicker(returnInterval)
	defer ret.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			for _, p := range l.all() {
				p.giveBack(rctx, true)
			}
			cancel()
			return nil
		case <-renew.C:
			for _, p := range l.all() {
				p.renew(ctx)
			}
		case <-ret.C:
			for _, p := range l.all() {
				p.giveBack(ctx, false)
			}
		}
	}
}

func (l *Leases) all() []*Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*Pool, 0, len(l.pools))
	for _, p := range l.pools {
		out = append(out, p)
	}
	return out
}

// Pool is one instance's request slots as this replica sees them. It implements
// balance.RequestPool.
type Pool struct {
	l        *Leases
	instance string
	keys     []string
	capFn    atomic.Pointer[func() int]

	// word packs the lease (high 32 bits) and the slots in use (low 32 bits), so admitting
	// (in use < lease) and shrinking the lease (lease − n ≥ in use) never race.
	word atomic.Uint64
	// validUntil is when the lease stops being safe to spend without a renewal (Unix ns).
	validUntil atomic.Int64
	// deniedUntil stops borrow attempts for a moment after one got nothing (Unix ns).
	deniedUntil atomic.Int64

	mu sync.Mutex // one lease change of this pool at a time

	waiting atomic.Int64 // callers queued for mu in TryAcquire
	// idleTicks counts the return rounds that found nothing in use (guarded by mu); after
	// idleRounds of them the whole lease goes back, so idle replicas keep no reserve.
	idleTicks int
}

// idleRounds is how many idle return rounds (250 ms each) a pool keeps its reserve chunk.
const idleRounds = 4

func split(w uint64) (lease, used int64) { return int64(w >> 32), int64(w & 0xffffffff) }
func pack(lease, used int64) uint64      { return uint64(lease)<<32 | uint64(used) }

// tryLocal admits within the lease.
func (p *Pool) tryLocal(now int64) bool {
	if now >= p.validUntil.Load() {
		return false
	}
	for {
		w := p.word.Load()
		lease, used := split(w)
		if used >= lease {
			return false
		}
		if p.word.CompareAndSwap(w, pack(lease, used+1)) {
			return true
		}
	}
}

// TryAcquire takes one request slot: from the lease when it has room (no round trip), else by
// borrowing a chunk from Redis.
func (p *Pool) TryAcquire() bool {
	now := p.l.now().UnixNano()
	if p.tryLocal(now) {
		return true
	}
	if now < p.deniedUntil.Load() {
		return false
	}
	// One borrow at a time per pool. A borrow asks for the callers queued behind it too, so
	// a burst costs a round trip or two, and callers behind a borrow that got nothing give up.
	p.waiting.Add(1)
	p.mu.Lock()
	p.waiting.Add(-1)
	defer p.mu.Unlock()
	now = p.l.now().UnixNano()
	if p.tryLocal(now) { // another caller borrowed meanwhile
		return true
	}
	if now < p.deniedUntil.Load() { // another caller's borrow just got nothing
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), borrowTimeout)
	defer cancel()
	lease, used := split(p.word.Load())
	// Enough for this caller, those waiting for this borrow, and one chunk more; plus what
	// is in flight beyond a lease Redis dropped.
	want := int64(p.l.chunk) + p.waiting.Load() + max(0, used-lease)
	granted, err := p.changeLocked(ctx, want)
	switch {
	case err != nil: // Redis unreachable: do not make every request wait for it
		p.deniedUntil.Store(p.l.now().Add(10 * denyBackoff).UnixNano())
		return false
	case granted == 0:
		p.deniedUntil.Store(p.l.now().Add(denyBackoff).UnixNano())
		return false
	}
	return p.tryLocal(p.l.now().UnixNano())
}

// Release gives back one slot taken by TryAcquire.
func (p *Pool) Release() {
	for {
		w := p.word.Load()
		lease, used := split(w)
		if used == 0 {
			return
		}
		if p.word.CompareAndSwap(w, pack(lease, used-1)) {
			return
		}
	}
}

// InFlight returns this replica's slots in use.
func (p *Pool) InFlight() int {
	_, used := split(p.word.Load())
	return int(used)
}

// Lease returns the slots this replica holds.
func (p *Pool) Lease() int {
	lease, _ := split(p.word.Load())
	return int(lease)
}

// changeLocked runs the lease script with delta and sets the local lease to Redis's answer. A
// return (delta < 0) shrinks the local lease first, so local use never exceeds what Redis
// grants. p.mu must be held.
func (p *Pool) changeLocked(ctx context.Context, delta int64) (int64, error) {
	if delta < 0 {
		for {
			w := p.word.Load()
			lease, used := split(w)
			delta = max(delta, used-lease) // never below the slots in use
			if delta == 0 {
				return 0, nil
			}
			if p.word.CompareAndSwap(w, pack(lease+delta, used)) {
				break
			}
		}
	}
	start := p.l.now()
	capFn := *p.capFn.Load()
	res, err := leaseScript.Exec(ctx, p.l.c, p.keys, []string{p.l.replica, p.instance,
		strconv.FormatInt(delta, 10), strconv.Itoa(capFn()), strconv.FormatInt(start.UnixMilli(), 10),
		strconv.FormatInt(p.l.ttl.Milliseconds(), 10)}).AsIntSlice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("lease script: unexpected reply %v", res)
	}
	if err != nil {
		if delta < 0 {
			// Redis still counts what could not be returned; the next renewal resyncs.
			p.l.log.Debug("quota: returning slots failed", "instance", p.instance, "err", err)
		}
		return 0, fmt.Errorf("quota: lease of %s: %w", p.instance, err)
	}
	mine := res[1]
	for {
		w := p.word.Load()
		_, used := split(w)
		if p.word.CompareAndSwap(w, pack(mine, used)) {
			break
		}
	}
	if mine > 0 {
		// Redis keeps the lease until start+ttl by its clock; stop spending it a little
		// earlier than that.
		p.validUntil.Store(start.Add(p.l.ttl - p.l.ttl/10).UnixNano())
	}
	return res[0], nil
}

// renew refreshes the lease (and learns if Redis dropped it).
func (p *Pool) renew(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if lease, used := split(p.word.Load()); lease == 0 && used == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, borrowTimeout)
	defer cancel()
	if _, err := p.changeLocked(rctx, 0); err != nil && !errors.Is(err, context.Canceled) {
		p.l.log.Warn("quota: renewing a lease failed; spending only what is held until it expires", "instance", p.instance, "err", err)
	}
}

// giveBack returns idle slots beyond one chunk (all idle slots when all is set).
func (p *Pool) giveBack(ctx context.Context, all bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lease, used := split(p.word.Load())
	if used == 0 {
		p.idleTicks++
	} else {
		p.idleTicks = 0
	}
	keep := int64(p.l.chunk)
	switch {
	case all || p.idleTicks >= idleRounds:
		keep = 0
	case lease-used <= 2*keep:
		return
	}
	if n := lease - used - keep; n > 0 {
		rctx, cancel := context.WithTimeout(ctx, borrowTimeout)
		defer cancel()
		_, _ = p.changeLocked(rctx, -n)
	}
}

// SessionCounter reports an instance's session count as the shared store keeps it
// (session.SlotStore.SessionCount).
type SessionCounter interface {
	SessionCount(ctx context.Context, service, instance string) int
}

// SharedSlots returns the counters of affinity.WithSharedSlots: request slots from these
// leases, session counts from the store.
func (l *Leases) SharedSlots(counts SessionCounter) func(k registry.Key, sessionCap, requestCap int) *balance.Slots {
	return func(k registry.Key, sessionCap, requestCap int) *balance.Slots {
		var sl *balance.Slots
		pool := l.Pool(k.Service, k.ID, func() int { _, c := sl.Caps(); return c })
		sl = balance.NewSharedSlots(sessionCap, requestCap, pool, func() int {
			return counts.SessionCount(context.Background(), k.Service, k.ID)
		})
		return sl
	}
}

// Held returns the slots this replica's lease holds of an instance (0 for an unknown one).
func (l *Leases) Held(service, instance string) int {
	l.mu.Lock()
	p := l.pools[poolKey{service, instance}]
	l.mu.Unlock()
	if p == nil {
		return 0
	}
	return p.Lease()
}
