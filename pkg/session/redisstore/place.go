package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/session"
)

var _ session.SlotStore = (*Store)(nil)

// pickLua is the placement rule (SlotStore) in Lua, shared by placeScript and reserveScript:
// over n = ARGV[nArg] candidates, ARGV[nArg+1…] triples (instance, pool "1" active | "2"
// standby, cap), counts in the hash KEYS[countsKey], it sets inst, best (1-based), bestPool to
// the first pool's fullest instance below its cap, or returns {-1, 0} when none has room.
func pickLua(nArg, countsKey int) string {
	return fmt.Sprintf(`
local n = tonumber(ARGV[%[1]d])
local best, bestCount, bestPool = -1, -1, 0
for pool = 1, 2 do
  for j = 1, n do
    local b = %[1]d + (j - 1) * 3
    if ARGV[b + 2] == tostring(pool) then
      local c = tonumber(redis.call('HGET', KEYS[%[2]d], ARGV[b + 1]) or '0')
      if c < tonumber(ARGV[b + 3]) and c > bestCount then best, bestCount, bestPool = j, c, pool end
    end
  end
  if best > 0 then break end
end
if best < 0 then return {-1, 0} end
local inst = ARGV[%[1]d + (best - 1) * 3 + 1]
`, nArg, countsKey)
}

// placeScript places a session: it picks the instance by the rule over the counts in KEYS[4]
// and writes the record with it, and moves or ends the predecessor binding, atomically.
//
//	KEYS: session, exp, ids, counts, candidate instance zsets × n, old instance zset (or any)
//	ARGV: time ("": TIME), guard kind, guard time (µs) (clock.go), expected version, n,
//	      n × (instance, pool "1" active | "2" standby, cap),
//	      old instance ("" none), old holds a slot "1"|"0",
//	      nf, nf record fields, exp score, id, new holds a slot "1"|"0", channel, message
//
// It returns {0} on a version conflict, {-2} when the guard failed, {-1} without room, else
// {index, pool}.
var placeScript = rueidis.NewLuaScript(luaNow + `
local cur = redis.call('HGET', KEYS[1], 'v') or ''
if cur ~= ARGV[4] then return {0, 0} end
` + luaGuard("{-2, 0}") + pickLua(5, 4) + `
local i = 6 + n * 3
local oldInst, oldHolds = ARGV[i], ARGV[i + 1]
i = i + 2
local nf = tonumber(ARGV[i]); i = i + 1
local fields = {unpack(ARGV, i, i + nf - 1)}; i = i + nf
local score, id, holds = ARGV[i], ARGV[i + 1], ARGV[i + 2]; i = i + 3
if oldInst ~= '' then
  redis.call('ZREM', KEYS[5 + n], id)
  if oldHolds == '1' then redis.call('HINCRBY', KEYS[4], oldInst, -1) end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HSET', KEYS[1], 'inst', inst)
redis.call('ZADD', KEYS[2], score, id)
redis.call('ZADD', KEYS[3], 0, id)
redis.call('ZADD', KEYS[4 + best], 0, id)
if holds == '1' then redis.call('HINCRBY', KEYS[4], inst, 1) end
if ARGV[i] ~= '' then redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
return {best, bestPool}
`)

// placement is a PlaceCreate's candidates.
type placement struct {
	c []session.PlaceCandidate
	// results
	instance string
	scaleOut bool
}

// placeArgs builds the script's keys and arguments.
func (r *Store) placeArgs(service, id, expect string, g guard, c []session.PlaceCandidate, oldInst string, oldHolds bool,
	rec session.Session, v int64, holds bool, pubCh, pubMsg string) ([]string, []string) {
	keys := []string{r.keySession(service, id), r.keyExp(service), r.keyIDs(service), r.keyCounts(service)}
	args := []string{r.scriptNow(), g.kind, g.at, expect, strconv.Itoa(len(c))}
	for _, x := range c {
		pool := "1"
		if x.Standby {
			pool = "2"
		}
		keys = append(keys, r.keyInstance(service, x.Instance))
		args = append(args, x.Instance, pool, strconv.Itoa(x.Cap))
	}
	keys = append(keys, r.keyInstance(service, oldInst))
	fields := encodeFields(rec, v)
	args = append(args, oldInst, boolStr(oldHolds), strconv.Itoa(len(fields)))
	args = append(args, fields...)
	args = append(args, ms(r.reapAt(rec)), id, boolStr(holds), pubCh, pubMsg)
	return keys, args
}

// runPlace executes the script and decodes its answer: applied false on a version conflict,
// errGuard when the guard failed. Placements are acknowledged writes (WithDurability): applied
// true with an ErrNotDurable means the script ran but the write is not durable as configured.
func (r *Store) runPlace(ctx context.Context, keys, args []string, c []session.PlaceCandidate) (applied bool, p placement, err error) {
	w, ack := r.writer(keys[0])
	res, err := placeScript.Exec(ctx, w, keys, args).AsIntSlice()
	if err := r.check(err); err != nil {
		return false, p, err
	}
	if len(res) != 2 {
		return false, p, fmt.Errorf("placement script: unexpected reply %v", res)
	}
	switch {
	case res[0] == 0:
		return false, p, nil
	case res[0] == -2:
		return false, p, errGuard
	case res[0] < 0:
		return true, p, session.ErrNoRoom
	}
	p.instance, p.scaleOut = c[res[0]-1].Instance, res[1] == 2
	return true, p, r.acked(ack)
}

// PlaceCreate implements session.SlotStore.
func (r *Store) PlaceCreate(ctx context.Context, s session.Session, c []session.PlaceCandidate) (string, bool, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return "", false, err
	}
	if len(c) == 0 {
		return "", false, fmt.Errorf("create session %q: %w", s.ID, session.ErrNoRoom)
	}
	s.Instance = c[0].Instance // validated like any instance name; the script sets the real one
	for _, x := range c {
		if err := session.CheckName("instance", x.Instance); err != nil {
			return "", false, fmt.Errorf("create session %q: %w", s.ID, err)
		}
	}
	s, err := session.PrepareCreate(r.callerTimes(s), r.now())
	if err != nil {
		return "", false, err
	}
	if err := r.registerService(ctx, s.Service); err != nil {
		return "", false, fmt.Errorf("create session %q: %w", s.ID, err)
	}
	p := &placement{c: c}
	for i := range casAttempts {
		ok, prev, err := r.tryCreate(ctx, s, p, "", i == 0)
		if err != nil {
			r.retract(s.Service, s.ID, err)
			return "", false, fmt.Errorf("create session %q: %w", s.ID, err)
		}
		if ok {
			if prev != nil {
				r.announce(*prev)
			}
			return p.instance, p.scaleOut, nil
		}
	}
	return "", false, fmt.Errorf("create session %q: %w: too many concurrent changes", s.ID, session.ErrStoreUnavailable)
}

// placeCreate is tryCreate's placement branch: m holds the predecessor's end, if any.
func (r *Store) placeCreate(ctx context.Context, m *mutation, s session.Session, old stored, prev *session.Session, p *placement) (bool, *session.Session, error) {
	oldInst, oldHolds := "", false
	if prev != nil {
		oldInst, oldHolds = old.s.Instance, holdsSlot(old.s.Kind)
	}
	keys, args := r.placeArgs(s.Service, s.ID, old.v, m.guard, p.c, oldInst, oldHolds, s, nextVersion(old.v), holdsSlot(s.Kind), m.pubCh, m.pubMsg)
	applied, res, err := r.runPlace(ctx, keys, args, p.c)
	r.wrote(m.hk)
	if errors.Is(err, errGuard) {
		return false, nil, session.ErrExists // Redis's clock says the old one is still live
	}
	if err != nil || !applied {
		return false, nil, err
	}
	p.instance, p.scaleOut = res.instance, res.scaleOut
	// This handle knows the record it placed, as after Create: if Redis hangs or goes away
	// before the session's first read, it still routes (degraded mode) instead of failing.
	s.Instance = res.instance
	r.remember(m.hk, stored{s: s, v: strconv.FormatInt(nextVersion(old.v), 10)})
	return true, prev, nil
}

// PlaceMove implements session.SlotStore.
func (r *Store) PlaceMove(ctx context.Context, service, id, from string, c []session.PlaceCandidate) (string, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if len(c) == 0 {
		return "", fmt.Errorf("move session %q: %w", id, session.ErrNoRoom)
	}
	for range casAttempts {
		now := r.now()
		old, err := r.read(ctx, service, id)
		if err != nil {
			return "", fmt.Errorf("move session %q: %w", id, err)
		}
		if !old.present() {
			return "", fmt.Errorf("move session %q: %w", id, session.ErrChanged)
		}
		cur := r.withTouch(old.s)
		if !cur.ActiveAt(now) || cur.Instance != from {
			return "", fmt.Errorf("move session %q: %w", id, session.ErrChanged)
		}
		cur.LastModified = now
		holds := holdsSlot(cur.Kind)
		keys, args := r.placeArgs(service, id, old.v, aliveAt(cur.ExpiresAt()), c, from, holds, cur, nextVersion(old.v), holds, "", "")
		applied, res, err := r.runPlace(ctx, keys, args, c)
		r.wrote(hotKey{service, id})
		if errors.Is(err, errGuard) {
			return "", fmt.Errorf("move session %q: %w", id, session.ErrChanged) // lapsed on Redis's clock
		}
		if err != nil {
			return "", fmt.Errorf("move session %q: %w", id, err)
		}
		if applied {
			// This handle knows the record it moved, as after PlaceCreate: if Redis hangs or
			// goes away before the session's next read, it routes to where the session now is
			// (degraded mode), not to the instance it was moved from.
			cur.Instance = res.instance
			r.remember(hotKey{service, id}, stored{s: cur, v: strconv.FormatInt(nextVersion(old.v), 10)})
			return res.instance, nil
		}
	}
	return "", fmt.Errorf("move session %q: %w: too many concurrent changes", id, session.ErrStoreUnavailable)
}

// SessionCount implements session.SlotStore.
func (r *Store) SessionCount(ctx context.Context, service, instance string) int {
	if !r.up.Load() {
		return 0
	}
	ctx, cancel := r.bound(ctx)
	defer cancel()
	n, err := r.c.DoCache(ctx, r.c.B().Hget().Key(r.keyCounts(service)).Field(instance).Cache(), r.cacheTTL).AsInt64()
	if err != nil {
		_ = r.check(err)
		return 0
	}
	return int(n)
}
