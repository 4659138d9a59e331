package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	DefaultTTL   = 10 * time.Second
	DefaultChunk = 16
	// DefaultDegradedFor is how long a replica cut off from Redis keeps admitting within the
	// slots it held (store.redis.degradedFor). It is also how long a dead replica's slots stay
	// taken and how long a new epoch's learning window lasts: 15 s covers a Redis restart and
	// a Sentinel failover with down-after ≤ 10 s, and keeps a dead replica's slots lost to the
	// others for at most 15 s.
	DefaultDegradedFor = 15 * time.Second
	// DefaultCallTimeout bounds a Redis call made on a request's path: a quarter of Envoy's
	// default ext_proc message_timeout (see CallTimeout).
	DefaultCallTimeout = 125 * time.Millisecond

	denyBackoff    = 50 * time.Millisecond
	renewTimeout   = time.Second
	returnInterval = 250 * time.Millisecond
)

// CallTimeout is the deadline of a Redis call on a request's path for an Envoy ext_proc
// message_timeout: a quarter of it, so that the decision, its other work and the network stay
// well inside what Envoy waits.
func CallTimeout(messageTimeout time.Duration) time.Duration { return messageTimeout / 4 }

// leaseScript sets this replica's lease of one instance's slots (see the package doc).
//
//	KEYS: P{svc}:L:<inst>, P{svc}:lx, P{svc}:qe, P{svc}:D:<inst>
//	ARGV: replica, instance, want, used, held, demand, cap, hold (ms), my epoch, new epoch id,
//	      seq, check run id (1/0)
//
// want is the lease asked for; used the slots in use; held the lease the replica may still
// spend (0 once its fence passed): re-asserted under a new epoch. Detached holds (KEYS[4],
// see Pool.Detach) count as taken until they expire, whatever their epoch. It returns {lease,
// fair target, epoch, learning (1/0), stale call (1/0), detached holds}.
var leaseScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, inst = ARGV[1], ARGV[2]
local want, used, held, demand = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cap, hold, mine, seq = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[11])
local run = ''
if ARGV[12] == '1' then
  run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
end
local eid, since
local e = redis.call('GET', KEYS[3])
if e then
  local a, b, c = string.match(e, '^([^,]*),([^,]*),(.*)$')
  if a and (ARGV[12] ~= '1' or c == run) then eid, since = a, tonumber(b) end
end
if not eid then
  eid, since = ARGV[10], now
  redis.call('SET', KEYS[3], eid .. ',' .. now .. ',' .. run)
end
local learning = now < since + hold
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local detached = redis.call('ZCARD', KEYS[4])
local f = redis.call('HGETALL', KEYS[1])
local others, odemand, starved = detached, 0, false
local cur, curseq, curclaim = -1, -1, 0
local oclaims, oslots = 0, 0
local list = {}
for i = 1, #f, 2 do
  local r = f[i]
  local s, d, ep, q, c = string.match(f[i + 1], '^(%d+),(%d+),([^,]*),(%d+),?(%d*)$')
  if not s then
    -- A record of protocol 1 (e11d6a0: slots only; lease_e11d6a0.go): a lease of this epoch,
    -- counted until it lapses.
    s = string.match(f[i + 1], '^(%d+)$')
    if s then ep = eid end
  end
  s, d, q, c = tonumber(s or '0'), tonumber(d or '0'), tonumber(q or '0'), tonumber(c) or 0
  local m = inst .. '|' .. r
  local exp = tonumber(redis.call('ZSCORE', KEYS[2], m) or '0')
  if exp <= now or (ep ~= eid and not learning) then
    redis.call('HDEL', KEYS[1], r)
    redis.call('ZREM', KEYS[2], m)
  elseif r == me then
    if ep == eid then cur, curseq, curclaim = s, q, c end
  else
    others = others + s
    if ep == eid then
      oclaims, oslots = oclaims + c, oslots + s
      odemand = odemand + d
      if d > s then starved = true end
      list[#list + 1] = {s, d}
    end
  end
end
if cur >= 0 and seq <= curseq then
  return {cur, cap, eid, learning and 1 or 0, 1, detached}
end
local base = used
local claim = 0
if cur >= 0 then
  base = math.max(base, cur)
  claim = curclaim
elseif mine ~= eid then
  base = math.max(base, held)
  claim = held
end
local share = cap
local owed = 0
if starved then
  local dall = math.max(demand, 1) + odemand
  share = math.floor(cap * math.max(demand, 1) / dall)
  for _, x in ipairs(list) do
    local sh = math.min(x[2], math.floor(cap * x[2] / dall))
    if sh > x[1] then owed = owed + sh - x[1] end
  end
end
local upper = base
local room = cap - others - base
if (not learning) and room > owed then
  upper = base + room - owed
elseif learning then
  -- What re-asserting replicas claimed of the old epoch's slots and have given back since
  -- (a slot detached since is not given back: its hold counts).
  local freed = oclaims + claim - oslots - base - detached
  if freed > 0 then upper = base + freed end
end
local new = math.max(used, math.min(want, upper))
local m = inst .. '|' .. me
if new > 0 or demand > 0 then
  redis.call('HSET', KEYS[1], me, new .. ',' .. demand .. ',' .. eid .. ',' .. ARGV[11] .. ',' .. claim)
  redis.call('ZADD', KEYS[2], now + hold, m)
else
  redis.call('HDEL', KEYS[1], me)
  redis.call('ZREM', KEYS[2], m)
end
return {new, share, eid, learning and 1 or 0, 0, detached}
`)

// detachScript turns one slot of this replica's lease into a detached hold (Pool.Detach). It
// refuses (0) unless Redis holds the replica's lease, not yet expired, with a slot, under the
// data set's current epoch (and, when checking run ids, of the Redis process answering): only
// then is the slot still counted against the cap, so adding the hold can never lend it twice.
//
//	KEYS: P{svc}:L:<inst>, P{svc}:lx, P{svc}:qe, P{svc}:D:<inst>
//	ARGV: replica, instance, my epoch, hold id, hold (ms), check run id (1/0)
//
// It returns {1, expiry (ms, Redis time)} or {0, 0}.
var detachScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local e = redis.call('GET', KEYS[3])
if not e then return {0, 0} end
local eid, _, run = string.match(e, '^([^,]*),([^,]*),(.*)$')
if eid ~= ARGV[3] then return {0, 0} end
if ARGV[6] == '1' and run ~= (string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '') then return {0, 0} end
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return {0, 0} end
local s, ep = string.match(rec, '^(%d+),%d+,([^,]*),')
if ep ~= eid or tonumber(s or '0') < 1 then return {0, 0} end
if tonumber(redis.call('ZSCORE', KEYS[2], ARGV[2] .. '|' .. ARGV[1]) or '0') <= now then return {0, 0} end
local exp = now + tonumber(ARGV[5])
redis.call('ZADD', KEYS[4], exp, ARGV[4])
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[4], math.max(exp, tonumber(last[2])))
return {1, exp}
`)

// seedScript marks a service's data set as fresh: its epoch starts with its learning window
// already over. It does nothing if the epoch exists. KEYS: P{svc}:qe; ARGV: id, hold (ms).
var seedScript = rueidis.NewLuaScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
redis.call('SET', KEYS[1], ARGV[1] .. ',' .. (now - tonumber(ARGV[2]) - 1) .. ',' .. run)
return 1
`)

// Leases is one replica's view of the shared request slots. Safe for concurrent use.
type Leases struct {
	c           rueidis.Client
	prefix      string
	replica     string
	ttl         time.Duration
	degradedFor time.Duration
	margin      time.Duration
	callTimeout time.Duration
	chunk       int
	trustRuns   bool
	log         *slog.Logger
	clock       func() time.Time
	base        time.Time // clock() at New: local times are monotonic offsets from it

	// breakerUntil: request paths skip Redis until then (monotonic ns); a background call
	// that gets through closes it.
	breakerUntil atomic.Int64
	// epochChanges counts the new epochs this replica met (Redis lost or may have lost data).
	epochChanges atomic.Int64
	// lastEpoch is when (Unix ns, the replica's clock) it last met one; 0: never.
	lastEpoch atomic.Int64
	// legacy: the records are written in protocol 1 (SpeakProtocol, lease_e11d6a0.go).
	legacy atomic.Bool

	mu    sync.Mutex
	pools map[poolKey]*Pool
}

type poolKey struct{ service, instance string }

// Option configures Leases.
type Option func(*Leases)

// WithTTL sets the lease time to live (default DefaultTTL): leases are renewed every TTL/3,
// and the hold (how long Redis keeps a record) is max(TTL, degradedFor).
func WithTTL(d time.Duration) Option {
	return func(l *Leases) {
		if d > 0 {
			l.ttl = d
		}
	}
}

// WithDegradedFor sets how long a replica cut off from Redis keeps admitting within the slots
// it held (default DefaultDegradedFor; store.redis.degradedFor). See the package doc: it is
// also how long a dead replica's slots stay taken.
func WithDegradedFor(d time.Duration) Option {
	return func(l *Leases) {
		if d > 0 {
			l.degradedFor = d
		}
	}
}

// WithMargin sets how long before Redis forgets a lease the replica stops spending it
// (default max(hold/10, 1 s), at most hold/2): the bound on clock-rate drift and on the time
// an exchange told to end at the fence takes to end.
func WithMargin(d time.Duration) Option {
	return func(l *Leases) {
		if d > 0 {
			l.margin = d
		}
	}
}

// WithCallTimeout bounds a Redis call made on a request's path (default DefaultCallTimeout;
// tether serve uses CallTimeout of the bootstrap's message_timeout).
func WithCallTimeout(d time.Duration) Option {
	return func(l *Leases) {
		if d > 0 {
			l.callTimeout = d
		}
	}
}

// WithChunk sets how many slots one borrow asks for (default DefaultChunk).
func WithChunk(n int) Option {
	return func(l *Leases) {
		if n > 0 {
			l.chunk = n
		}
	}
}

// WithTrustRestarts says that Redis loses no acknowledged write when it restarts or fails
// over (appendfsync always, or writes acknowledged by a replica): only a lost epoch key then
// starts a new epoch. Without it, any other Redis process answering does.
func WithTrustRestarts(trust bool) Option { return func(l *Leases) { l.trustRuns = trust } }

// WithClock sets the replica's clock (default time.Now). Only durations measured on it count
// (local timers); a clock off by any constant amount changes nothing.
func WithClock(now func() time.Time) Option {
	return func(l *Leases) {
		if now != nil {
			l.clock = now
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
	l := &Leases{c: c, prefix: prefix, replica: replica, ttl: DefaultTTL, degradedFor: DefaultDegradedFor,
		callTimeout: DefaultCallTimeout, chunk: DefaultChunk, log: slog.New(slog.DiscardHandler), clock: time.Now,
		pools: map[poolKey]*Pool{}}
	for _, o := range opts {
		o(l)
	}
	if l.margin <= 0 {
		l.margin = max(l.Hold()/10, time.Second)
	}
	l.margin = min(l.margin, l.Hold()/2)
	l.base = l.clock()
	return l
}

// Hold is how long Redis keeps a lease after the script that granted or renewed it:
// max(TTL, degradedFor).
func (l *Leases) Hold() time.Duration { return max(l.ttl, l.degradedFor) }

// EpochChanges counts the new epochs of Redis's data set this replica met (a restart without
// its data, a failover, an evicted key): each one is a learning window (see the package doc).
func (l *Leases) EpochChanges() int64 { return l.epochChanges.Load() }

// LastEpochChange returns when this replica last met a new epoch, on its clock (zero: never).
func (l *Leases) LastEpochChange() time.Time {
	if n := l.lastEpoch.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// mono is the replica's monotonic time in ns since New.
func (l *Leases) mono() int64 { return int64(l.clock().Sub(l.base)) }

func (l *Leases) tag(service string) string { return l.prefix + "{" + service + "}" }

// Seed marks service's lease data set as fresh when Redis has none yet, so that its first
// epoch needs no learning window. Only for a Redis known to be new (tests, a first start an
// operator vouches for): on a Redis that lost its data it would let leases still held by
// replicas cut off from it be lent again.
func (l *Leases) Seed(ctx context.Context, service string) error {
	return seedScript.Exec(ctx, l.c, []string{l.tag(service) + ":qe"},
		[]string{newEpochID(), strconv.FormatInt(l.Hold().Milliseconds(), 10)}).Error()
}

// HasEpoch reports whether service's lease data set has an epoch in Redis: a replica has used
// it, or it was seeded.
func (l *Leases) HasEpoch(ctx context.Context, service string) (bool, error) {
	n, err := l.c.Do(ctx, l.c.B().Exists().Key(l.tag(service)+":qe").Build()).AsInt64()
	return n == 1, err
}

func newEpochID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Pool returns the pool of one instance's request slots; capFn returns the cap in force (read
// at every call to Redis). The same pool is returned for the same instance.
func (l *Leases) Pool(service, instance string, capFn func() int) *Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := poolKey{service, instance}
	if p := l.pools[k]; p != nil {
		p.capFn.Store(&capFn)
		return p
	}
	tag := l.tag(service)
	p := &Pool{l: l, instance: instance, sem: make(chan struct{}, 1),
		keys: []string{tag + ":L:" + instance, tag + ":lx", tag + ":qe", tag + ":D:" + instance}}
	p.capFn.Store(&capFn)
	p.target.Store(1 << 31)
	p.seq = time.Now().UnixMicro() // a later process under the same name starts above (< 2^53: exact in Lua)
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
			l.probe(ctx)
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

// Degraded reports whether request paths are skipping Redis now (the latency breaker is open).
func (l *Leases) Degraded() bool { return l.mono() < l.breakerUntil.Load() }

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
	// validUntil is the fence: when the lease stops being safe to spend (monotonic ns).
	validUntil atomic.Int64
	// deniedUntil stops borrow attempts for a moment after one got nothing (monotonic ns).
	deniedUntil atomic.Int64
	// target is the fair share Redis last reported: admissions stop at it.
	target atomic.Int64
	// refused counts the acquisitions refused since the last call to Redis (demand).
	refused atomic.Int64
	// lastUsed is when a slot was last taken (monotonic ns, to 100 ms).
	lastUsed atomic.Int64
	// peak is the most slots in use at once since the last return round (tryLocal raises it).
	peak atomic.Int64
	// learning is set while Redis reports the epoch's learning window.
	learning atomic.Bool
	// detached is the instance's detached holds (every replica's) Redis last reported.
	detached atomic.Int64
	// holds numbers this pool's detached holds (their ids are replica|n).
	holds atomic.Int64

	// sem is the pool's lock: one call to Redis at a time; it guards the fields below. A
	// channel, so that a request waits for it at most the call timeout (a background call
	// may hold it for longer against a hung Redis).
	sem chan struct{}

	epoch     string // the epoch of the lease
	seq       int64  // the last call's sequence number
	demanded  int64  // the demand Redis last recorded
	waiting   atomic.Int64
	idleTicks int
	// peaks are the peaks of the last idleRounds return rounds (a ring; next is the oldest):
	// what the return keeps is judged on their maximum, the demand of the last second.
	peaks [idleRounds]int64
	next  int
}

// idleRounds is how many return rounds (250 ms each) without a slot in use make a pool idle,
// and how many rounds' peaks the return keeps a lease for.
const idleRounds = 4

func (p *Pool) lock()   { p.sem <- struct{}{} }
func (p *Pool) unlock() { <-p.sem }

func split(w uint64) (lease, used int64) { return int64(w >> 32), int64(w & 0xffffffff) }
func pack(lease, used int64) uint64      { return uint64(lease)<<32 | uint64(used) }

// tryLocal admits within the lease, before the fence and below the fair target.
func (p *Pool) tryLocal(now int64) bool {
	if now >= p.validUntil.Load() {
		return false
	}
	target := p.target.Load()
	for {
		w := p.word.Load()
		lease, used := split(w)
		if used >= lease || used >= target && lease > target+int64(p.l.chunk) {
			return false
		}
		if p.word.CompareAndSwap(w, pack(lease, used+1)) {
			if now-p.lastUsed.Load() > int64(100*time.Millisecond) { // a store only now and then: no shared write per request
				p.lastUsed.Store(now)
			}
			for u := used + 1; ; { // a store only at a new peak
				pk := p.peak.Load()
				if u <= pk || p.peak.CompareAndSwap(pk, u) {
					break
				}
			}
			return true
		}
	}
}

// TryAcquire takes one request slot: from the lease when it has room (no round trip), else by
// borrowing a chunk from Redis (one call; none while the breaker is open). The wait for the
// pool's lock and the call are each bounded by the call timeout and together by ctx (the
// decision's deadline): a caller never waits past ctx's deadline.
func (p *Pool) TryAcquire(ctx context.Context) bool {
	l := p.l
	now := l.mono()
	if p.tryLocal(now) {
		return true
	}
	if now < p.deniedUntil.Load() || now < l.breakerUntil.Load() || ctx.Err() != nil {
		p.refused.Add(1)
		return false
	}
	// One borrow at a time per pool. A borrow asks for the callers queued behind it too, so
	// a burst costs a round trip or two, and callers behind a borrow that got nothing give up.
	p.waiting.Add(1)
	wctx, wcancel := context.WithTimeout(ctx, l.callTimeout)
	select {
	case p.sem <- struct{}{}:
		wcancel()
	case <-wctx.Done():
		wcancel()
		p.waiting.Add(-1)
		p.refused.Add(1)
		return p.tryLocal(l.mono())
	}
	p.waiting.Add(-1)
	defer p.unlock()
	now = l.mono()
	if p.tryLocal(now) { // another caller borrowed meanwhile
		return true
	}
	if now < p.deniedUntil.Load() || now < l.breakerUntil.Load() || ctx.Err() != nil {
		p.refused.Add(1)
		return false
	}
	lease, used := split(p.word.Load())
	if used >= p.target.Load() && used < lease {
		p.refused.Add(1)
		return false // below the lease but at the fair share: no borrow helps
	}
	ctx, cancel := context.WithTimeout(ctx, l.callTimeout)
	defer cancel()
	want := max(lease, used) + int64(l.chunk) + p.waiting.Load()
	got, err := p.callLocked(ctx, want, 1)
	switch {
	case err != nil: // Redis unreachable or slow: the breaker is open now
		p.refused.Add(1)
		return false
	case got <= lease:
		p.refused.Add(1)
		p.deniedUntil.Store(l.mono() + int64(denyBackoff))
		return false
	}
	if p.tryLocal(l.mono()) {
		return true
	}
	p.refused.Add(1)
	return false
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

// ErrNotDetached is Detach's refusal: the slot stays this replica's, in use.
var ErrNotDetached = errors.New("quota: slot not detached")

// Detach turns one slot taken by TryAcquire into a detached hold: an exchange that goes on
// without this replica (an ext_proc stream handed off to Envoy at shutdown) keeps its slot
// counted against the cap by every replica for d — the longest the exchange can still last —
// plus the margin, from when Redis runs the call, by Redis's clock, whether or not this
// replica is still there. The slot leaves this replica's lease and its in-use count (its
// Release must not be called any more; the replica can stop, and clear its record, at once).
// The hold cannot be ended early: the slot stays taken for all of d even if the exchange ends
// sooner. Holds are kept in Redis as P{svc}:D:<inst> (see the package doc).
//
// Detach refuses (an error wrapping ErrNotDetached, or Redis's error; nothing changed here)
// when d ≤ 0 (no bound), no slot is in use, the replica speaks protocol 1 (replicas of
// e11d6a0 are connected: their script does not count holds), the lease is past its fence, or
// Redis does not hold this replica's lease under the current epoch: the exchange must then
// stay with the replica. A refusal whose reply was lost may still have added the hold: the slot is then
// counted twice until the hold expires (never less than once). The wait for the pool's lock
// and the call are bounded by ctx and by 1 s.
func (p *Pool) Detach(ctx context.Context, d time.Duration) error {
	l := p.l
	if d <= 0 {
		return fmt.Errorf("%w: the exchange has no bound on its lifetime", ErrNotDetached)
	}
	ctx, cancel := context.WithTimeout(ctx, renewTimeout)
	defer cancel()
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("quota: detaching a slot of %s: %w", p.instance, ctx.Err())
	}
	defer p.unlock()
	if lease, used := split(p.word.Load()); used < 1 || lease < 1 {
		return fmt.Errorf("%w: no slot of %s in use", ErrNotDetached, p.instance)
	}
	if l.legacy.Load() { // protocol 1: e11d6a0's lease script does not count holds
		return fmt.Errorf("%w: replicas of e11d6a0 share the Redis (protocol 1), and they do not count detached holds", ErrNotDetached)
	}
	if l.mono() >= p.validUntil.Load() || p.epoch == "" {
		return fmt.Errorf("%w: the lease of %s is past its fence", ErrNotDetached, p.instance)
	}
	check := "1"
	if l.trustRuns {
		check = "0"
	}
	id := l.replica + "|" + strconv.FormatInt(p.holds.Add(1), 10)
	ms := (d + l.margin + time.Millisecond - 1).Milliseconds()
	res, err := detachScript.Exec(ctx, l.c, p.keys, []string{l.replica, p.instance, p.epoch, id,
		strconv.FormatInt(ms, 10), check}).AsIntSlice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected reply of %d values", len(res))
	}
	if err != nil {
		return fmt.Errorf("quota: detaching a slot of %s: %w", p.instance, err)
	}
	if res[0] != 1 {
		return fmt.Errorf("%w: Redis holds no lease of %s for this replica under the current epoch", ErrNotDetached, p.instance)
	}
	for { // the slot leaves the lease with the exchange: Σ leases + holds stays what Redis granted
		w := p.word.Load()
		lease, used := split(w)
		if p.word.CompareAndSwap(w, pack(lease-1, used-1)) {
			break
		}
	}
	p.detached.Add(1)
	return nil
}

// Detached returns the instance's detached holds (every replica's) that Redis reported at the
// last call, plus those this replica added since.
func (p *Pool) Detached() int { return int(p.detached.Load()) }

// InFlight returns this replica's slots in use.
func (p *Pool) InFlight() int {
	_, used := split(p.word.Load())
	return int(used)
}

// Lease returns the slots this replica holds and may still spend (0 past the fence).
func (p *Pool) Lease() int {
	if p.l.mono() >= p.validUntil.Load() {
		return 0
	}
	lease, _ := split(p.word.Load())
	return int(lease)
}

// Fenced reports whether exchanges are in flight on a lease past its fence: they must end
// (the engine's sweeper tells them to), since Redis will lend their slots again a margin later.
func (p *Pool) Fenced() bool {
	return p.InFlight() > 0 && p.l.mono() >= p.validUntil.Load()
}

// Learning reports whether Redis reported the epoch's learning window at the last call.
func (p *Pool) Learning() bool { return p.learning.Load() }

// Target returns the fair share Redis last reported for this replica (the cap when nobody
// is starved).
func (p *Pool) Target() int { return int(min(p.target.Load(), 1<<31)) }

// callLocked runs the lease script asking for a lease of want and sets the local lease to
// Redis's answer; extra is demand beyond the slots in use, the waiting and the refused (the
// caller of a borrow). Asking for less shrinks the local lease first (never below the slots in
// use), so local use never exceeds what Redis records. It returns the new local lease. A
// failure opens the latency breaker until a background call gets through. p.sem must be held.
func (p *Pool) callLocked(ctx context.Context, want, extra int64) (int64, error) {
	l := p.l
	if l.legacy.Load() {
		return p.callE11d6a0Locked(ctx, want) // replicas of e11d6a0 share the Redis (lease_e11d6a0.go)
	}
	for {
		w := p.word.Load()
		lease, used := split(w)
		if want >= lease || p.word.CompareAndSwap(w, pack(max(want, used), used)) {
			break
		}
	}
	sent := l.mono()
	held := int64(0)
	lease, used := split(p.word.Load())
	if sent < p.validUntil.Load() {
		held = lease
	}
	cp := int64(max((*p.capFn.Load())(), 0))
	refused := p.refused.Swap(0)
	demand := min(cp, used+p.waiting.Load()+refused+extra)
	p.seq++
	check := "1"
	if l.trustRuns {
		check = "0"
	}
	res, err := leaseScript.Exec(ctx, l.c, p.keys, []string{l.replica, p.instance,
		strconv.FormatInt(want, 10), strconv.FormatInt(used, 10), strconv.FormatInt(held, 10),
		strconv.FormatInt(demand, 10), strconv.FormatInt(cp, 10), strconv.FormatInt(l.Hold().Milliseconds(), 10),
		p.epoch, newEpochID(), strconv.FormatInt(p.seq, 10), check}).ToArray()
	var vals [6]int64
	var epoch string
	if err == nil && len(res) != len(vals) {
		err = fmt.Errorf("unexpected reply of %d values", len(res))
	}
	for i := 0; err == nil && i < len(vals); i++ {
		if i == 2 {
			epoch, err = res[i].ToString()
		} else {
			vals[i], err = res[i].AsInt64()
		}
	}
	if err == nil && vals[4] == 1 {
		err = errors.New("a later call of this replica ran first") // cannot happen: seq only grows
	}
	if err != nil {
		p.refused.Add(refused)
		l.breakerUntil.Store(l.mono() + int64(l.Hold()))
		return lease, fmt.Errorf("quota: lease of %s: %w", p.instance, err)
	}
	granted, target := vals[0], vals[1]
	if epoch != p.epoch {
		if p.epoch != "" {
			l.epochChanges.Add(1)
			l.lastEpoch.Store(l.clock().UnixNano())
			l.log.Warn("quota: Redis's data set is a new epoch (it restarted, failed over or lost keys); the lease is re-acquired and nothing new is lent for one hold",
				"instance", p.instance, "old", p.epoch, "new", epoch, "lease", granted, "inUse", used, "hold", l.Hold().String())
		}
		p.epoch = epoch
	}
	p.demanded = demand
	p.learning.Store(vals[3] == 1)
	p.detached.Store(vals[5])
	for {
		w := p.word.Load()
		_, u := split(w)
		if p.word.CompareAndSwap(w, pack(granted, u)) {
			break
		}
	}
	p.target.Store(max(target, 1))
	// Redis keeps the record for hold after its script ran, which is after sent.
	p.validUntil.Store(sent + int64(l.Hold()-l.margin))
	l.breakerUntil.Store(0)
	return granted, nil
}

// renew refreshes the lease (re-asserting what is in use, reporting demand, learning the fair
// target and a new epoch).
func (p *Pool) renew(ctx context.Context) {
	p.lock()
	defer p.unlock()
	lease, used := split(p.word.Load())
	if lease == 0 && used == 0 && p.demanded == 0 && p.refused.Load() == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, renewTimeout)
	defer cancel()
	if _, err := p.callLocked(rctx, lease, 0); err != nil && !errors.Is(err, context.Canceled) {
		p.l.log.Warn("quota: renewing a lease failed; spending only what is held until its fence", "instance", p.instance,
			"lease", lease, "inUse", used, "fenceIn", time.Duration(p.validUntil.Load()-p.l.mono()).String(), "err", err)
	}
}

// giveBack returns idle slots beyond one chunk above the demand of the last second (the most
// slots in use at once over the last idleRounds rounds), or beyond the fair target (all idle
// slots when all is set). Nothing goes back while Redis is away: the lease is what degraded
// mode spends.
//
// The demand is the peak, not the slots in use at the round: exchanges shorter than a round
// come and go between rounds, so a sample at the round sees a fraction of them, and a lease
// cut to it is below what the replica's clients ask for a moment later — it borrows again
// (a round trip on a request's path), and if Redis goes away meanwhile, its known sessions get
// 429 for slots the instance had free (the fault schedules' known-session clients, 1 ms
// exchanges: 32 × 429 in a 4 s outage, before). An instance quiet for idleRounds rounds is idle:
// its lease goes back but for one slot.
func (p *Pool) giveBack(ctx context.Context, all bool) {
	p.lock()
	defer p.unlock()
	l := p.l
	lease, used := split(p.word.Load())
	recent := p.roundPeak(used)
	if recent == 0 {
		p.idleTicks++
	} else {
		p.idleTicks = 0
	}
	if !all && l.Degraded() {
		return
	}
	want := lease
	switch {
	case all:
		want = used
		p.refused.Store(0) // stopping: no demand any more
	case p.idleTicks >= idleRounds:
		// A replica that served the instance within a hold keeps one slot, so that its
		// sessions still route during an outage; the fair target takes it when others want it.
		want = 0
		if last := p.lastUsed.Load(); last != 0 && l.mono()-last < int64(l.Hold()) && (*p.capFn.Load())() >= 2 {
			want = 1
		}
	case lease-recent > 2*int64(l.chunk):
		want = recent + int64(l.chunk)
	}
	want = max(used, min(want, p.target.Load()))
	// Stopping, a replica also clears a record that holds no lease but still reports demand
	// (refused acquisitions), so that the others' fair shares stop counting it.
	if want < lease || all && p.epoch != "" {
		rctx, cancel := context.WithTimeout(ctx, renewTimeout)
		defer cancel()
		_, _ = p.callLocked(rctx, want, 0)
	}
}

// roundPeak ends a return round: it records the round's peak of slots in use (at least used,
// in use now) and returns the most in use at once over the last idleRounds rounds, this one
// included (0: none was in use at any moment of them). p.sem must be held.
func (p *Pool) roundPeak(used int64) int64 {
	p.peaks[p.next] = max(p.peak.Swap(used), used)
	p.next = (p.next + 1) % idleRounds
	recent := int64(0)
	for _, pk := range p.peaks {
		recent = max(recent, pk)
	}
	return recent
}

// probe checks, while the breaker is open, whether Redis answers again (then renews every
// lease at once, so the leases and the demand are in Redis again).
func (l *Leases) probe(ctx context.Context) {
	if !l.Degraded() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, renewTimeout)
	err := l.c.Do(pctx, l.c.B().Ping().Build()).Error()
	cancel()
	if err != nil {
		return
	}
	l.breakerUntil.Store(0)
	for _, p := range l.all() {
		p.renew(ctx)
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

// Held returns the slots this replica's lease holds of an instance and may still spend (0 for
// an unknown one).
func (l *Leases) Held(service, instance string) int {
	l.mu.Lock()
	p := l.pools[poolKey{service, instance}]
	l.mu.Unlock()
	if p == nil {
		return 0
	}
	return p.Lease()
}
