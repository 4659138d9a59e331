package quota

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Protocol 1: the request-slot leases of the builds up to commit e11d6a0, spoken while replicas
// of that protocol share the Redis (a rolling upgrade; pkg/protocol decides, SpeakProtocol
// switches).
//
// Their records: P{svc}:L:<inst> replica → slots (a plain integer), P{svc}:lx "<inst>|<replica>"
// → expiry in ms on the writer's wall clock; no epoch. Their script, leaseScriptE11d6a0Verbatim
// below, reads every record's value with tonumber: a record of protocol 2 ("slots,demand,…")
// makes it fail (a script error: that replica refuses the request, it counts nothing wrong).
// So while any replica of protocol 1 is connected this build writes protocol 1's records only,
// with the same script changed in one way: a record of protocol 2 (a replica that switched
// back, or a switch in progress) counts its slots. And protocol 2's script counts a record of
// protocol 1 as a lease of its epoch, kept until it lapses (quota.go): the two formats may
// coexist in one hash in either direction without a slot counted twice or forgotten.
//
// What holds while protocol 1 is spoken is what e11d6a0 promised (its package doc):
//
//   - Σ leases ≤ cap at every instant, as Redis records them;
//   - lease expiry is judged on the writers' wall clocks (every replica's clock must agree:
//     NTP), and a replica may spend a lease until TTL − max(TTL/10, margin) after it sent the
//     call that granted or renewed it (this build still fences, rule 2, so its own exchanges do
//     not outlive its lease; e11d6a0's do: a partition longer than the TTL can exceed the cap
//     by the exchanges still in flight on the cut-off replica until they end);
//   - no epoch: a Redis that loses its data (restart without it, failover) forgets leases still
//     being spent, and the cap can be exceeded for up to one TTL. While speaking protocol 1
//     this build keeps P{svc}:qe valid for Redis's current run (it seeds it), so that the
//     switch to protocol 2 does not start with a learning window: protocol 2's protection
//     starts at the switch.
//   - no fair shares: Redis grants whoever asks first; the target is the cap.

// leaseScriptE11d6a0Verbatim is e11d6a0's pkg/quota leaseScript, byte for byte (the tests run
// it against this build's records). KEYS: P{svc}:L:<inst>, P{svc}:lx; ARGV: replica, instance,
// delta, cap, now (ms), ttl (ms). It returns {granted delta, this replica's lease after it}.
const leaseScriptE11d6a0Verbatim = `
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
`

// leaseScriptE11d6a0 is what this build runs while speaking protocol 1: the verbatim script
// reading either format's slots (slotsOf), after keeping P{svc}:qe valid for Redis's run.
//
//	KEYS: P{svc}:L:<inst>, P{svc}:lx, P{svc}:qe
//	ARGV: replica, instance, delta, cap, now (ms, the replica's wall clock), ttl (ms),
//	      new epoch id, check run id (1/0), hold (ms)
var leaseScriptE11d6a0 = rueidis.NewLuaScript(e11d6a0Prelude + e11d6a0Compatible(leaseScriptE11d6a0Verbatim))

// e11d6a0Prelude defines slotsOf and seeds the epoch key unless it holds an epoch of this run
// (as protocol 2's script would accept it), with its learning window already over.
const e11d6a0Prelude = `
local function slotsOf(v) return tonumber(string.match(v or '', '^(%d+)')) or 0 end
local run = ''
if ARGV[8] == '1' then
  run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
end
local e = redis.call('GET', KEYS[3])
local a, b, c
if e then a, b, c = string.match(e, '^([^,]*),([^,]*),(.*)$') end
if not a or (ARGV[8] == '1' and c ~= run) then
  local t = redis.call('TIME')
  local tnow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[3], ARGV[7] .. ',' .. (tnow - tonumber(ARGV[9]) - 1) .. ',' .. run)
end
`

// e11d6a0Compatible makes the verbatim script read a record of either protocol: its two
// tonumber reads of a record become slotsOf. It panics if the script does not have them (a
// change of the constant).
func e11d6a0Compatible(script string) string {
	out := script
	for _, r := range [][2]string{
		{"sum = sum + tonumber(f[i + 1])", "sum = sum + slotsOf(f[i + 1])"},
		{"local mine = tonumber(redis.call('HGET', KEYS[1], me) or '0')", "local mine = slotsOf(redis.call('HGET', KEYS[1], me) or '0')"},
	} {
		if !strings.Contains(out, r[0]) {
			panic("quota: e11d6a0's lease script lacks " + r[0])
		}
		out = strings.Replace(out, r[0], r[1], 1)
	}
	return out
}

// SpeakProtocol sets the protocol of the lease records this replica writes: 1 (protocol.E11d6a0,
// while replicas of e11d6a0 are connected) or 2 (its own, the default). Safe at any time: each
// call to Redis uses the protocol set when it starts.
func (l *Leases) SpeakProtocol(p int) {
	if p == 1 {
		l.legacy.Store(true)
		return
	}
	l.legacy.Store(false)
}

// SpeakingProtocol returns the protocol of the lease records this replica writes.
func (l *Leases) SpeakingProtocol() int {
	if l.legacy.Load() {
		return 1
	}
	return 2
}

// legacyFence is how long after sent a lease of protocol 1 may be spent: Redis keeps it TTL
// after the replica's wall clock at the call, and the replica stops a margin earlier.
func (l *Leases) legacyFence() time.Duration {
	return l.ttl - min(max(l.ttl/10, l.margin), l.ttl/2)
}

// callE11d6a0Locked is callLocked in protocol 1: protocol 1 borrows and returns deltas, so it
// asks for the difference between want and the lease Redis records (the local one: shrunk
// first when want is less, never below the slots in use, so local use never exceeds what Redis
// records) and sets the local lease to what Redis then records. p.sem must be held.
func (p *Pool) callE11d6a0Locked(ctx context.Context, want int64) (int64, error) {
	l := p.l
	var before, after int64 // the local lease before and after the shrink
	for {
		w := p.word.Load()
		lease, used := split(w)
		before, after = lease, lease
		if want < lease {
			after = max(want, used)
		}
		if after == lease || p.word.CompareAndSwap(w, pack(after, used)) {
			break
		}
	}
	if want > before {
		after = want // a borrow: asked for, the local lease grows with Redis's answer only
	}
	sent := l.mono()
	cp := int64(max((*p.capFn.Load())(), 0))
	p.refused.Store(0) // protocol 1 records no demand
	check := "1"
	if l.trustRuns {
		check = "0"
	}
	res, err := leaseScriptE11d6a0.Exec(ctx, l.c, p.keys, []string{l.replica, p.instance,
		strconv.FormatInt(after-before, 10), strconv.FormatInt(cp, 10), strconv.FormatInt(l.clock().UnixMilli(), 10),
		strconv.FormatInt(l.ttl.Milliseconds(), 10), newEpochID(), check, strconv.FormatInt(l.Hold().Milliseconds(), 10)}).AsIntSlice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		l.breakerUntil.Store(l.mono() + int64(l.ttl))
		return min(after, before), fmt.Errorf("quota: lease of %s (protocol 1): %w", p.instance, err)
	}
	granted := res[1]
	for {
		w := p.word.Load()
		_, u := split(w)
		if p.word.CompareAndSwap(w, pack(granted, u)) {
			break
		}
	}
	p.demanded = 0
	p.learning.Store(false)
	p.target.Store(max(cp, 1))
	if granted > 0 {
		p.validUntil.Store(sent + int64(l.legacyFence()))
	}
	l.breakerUntil.Store(0)
	return granted, nil
}
