package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/session"
)

// casScript applies one change if the record's version is still the one the change was
// computed on and its guard holds on Redis's clock (clock.go). ARGV: time ("": TIME), guard
// kind, guard time (µs), expected version ("" = absent), "put"|"del", [n, n field/value
// strings], z, z × (key index, "a"|"r", score, member), h, h × (key index, field, delta),
// x, x × (reservations key index, counts key index, member): each reservation still held is
// removed and its slot given back (a reservation converted into the session), channel, msg.
// It returns 1 when applied, 0 when the version moved (the caller re-reads and retries), 2
// when the guard failed (the expiry the change relied on is not so on Redis's clock).
var casScript = rueidis.NewLuaScript(luaNow + `
local cur = redis.call('HGET', KEYS[1], 'v') or ''
if cur ~= ARGV[4] then return 0 end
` + luaGuard("2") + `
local i = 6
redis.call('DEL', KEYS[1])
if ARGV[5] == 'put' then
  local n = tonumber(ARGV[i]); i = i + 1
  redis.call('HSET', KEYS[1], unpack(ARGV, i, i + n - 1))
  i = i + n
end
local z = tonumber(ARGV[i]); i = i + 1
for _ = 1, z do
  local k = KEYS[tonumber(ARGV[i])]
  if ARGV[i + 1] == 'a' then redis.call('ZADD', k, ARGV[i + 2], ARGV[i + 3]) else redis.call('ZREM', k, ARGV[i + 3]) end
  i = i + 4
end
local h = tonumber(ARGV[i]); i = i + 1
for _ = 1, h do
  redis.call('HINCRBY', KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
local x = tonumber(ARGV[i]); i = i + 1
for _ = 1, x do
  if redis.call('ZREM', KEYS[tonumber(ARGV[i])], ARGV[i + 2]) == 1 then
    redis.call('HINCRBY', KEYS[tonumber(ARGV[i + 1])], string.match(ARGV[i + 2], '^(.*)|[^|]*$'), -1)
  end
  i = i + 3
end
if ARGV[i] ~= '' then redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
return 1
`)

// mutation is one compare-and-set change of a session and its indexes, all in its service's
// hash slot.
type mutation struct {
	hk     hotKey // the session it changes
	keys   []string
	expect string
	guard  guard
	put    []string // record fields; nil deletes the record
	zops   []string
	nz     int
	hops   []string
	nh     int
	xops   []string
	nx     int
	pubCh  string
	pubMsg string
	// acked: the write is acknowledged only once durable as configured (WithDurability).
	acked bool
}

func (r *Store) newMutation(service, id, expect string) *mutation {
	return &mutation{hk: hotKey{service, id}, keys: []string{r.keySession(service, id)}, expect: expect}
}

func (m *mutation) key(k string) string {
	i := slices.Index(m.keys, k)
	if i < 0 {
		m.keys = append(m.keys, k)
		i = len(m.keys) - 1
	}
	return strconv.Itoa(i + 1)
}

func (m *mutation) zadd(key, score, member string) {
	m.zops = append(m.zops, m.key(key), "a", score, member)
	m.nz++
}

func (m *mutation) zrem(key, member string) {
	m.zops = append(m.zops, m.key(key), "r", "0", member)
	m.nz++
}

func (m *mutation) hincr(key, field string, delta int) {
	m.hops = append(m.hops, m.key(key), field, strconv.Itoa(delta))
	m.nh++
}

// convert gives back the slot of reservation member (if it is still held) in the same step.
func (m *mutation) convert(reservations, counts, member string) {
	m.xops = append(m.xops, m.key(reservations), m.key(counts), member)
	m.nx++
}

func (m *mutation) args(now string) []string {
	a := []string{now, m.guard.kind, m.guard.at, m.expect}
	if m.put != nil {
		a = append(a, "put", strconv.Itoa(len(m.put)))
		a = append(a, m.put...)
	} else {
		a = append(a, "del")
	}
	a = append(a, strconv.Itoa(m.nz))
	a = append(a, m.zops...)
	a = append(a, strconv.Itoa(m.nh))
	a = append(a, m.hops...)
	a = append(a, strconv.Itoa(m.nx))
	a = append(a, m.xops...)
	return append(a, m.pubCh, m.pubMsg)
}

// errGuard reports a write not applied because its guard failed on Redis's clock.
var errGuard = errors.New("the expiry this change relied on is not so on Redis's clock")

// apply runs the mutation; false means the record changed since it was read; errGuard that
// its guard failed. A mutation marked acked that was applied but not made durable returns true
// with an ErrNotDurable.
func (r *Store) apply(ctx context.Context, m *mutation) (bool, error) {
	c, ack := r.c, (*ackClient)(nil)
	if m.acked {
		c, ack = r.writer(m.keys[0])
	}
	n, err := casScript.Exec(ctx, c, m.keys, m.args(r.scriptNow())).AsInt64()
	r.wrote(m.hk) // even on an error: it may have been applied
	if err := r.check(err); err != nil {
		return false, err
	}
	switch n {
	case 2:
		return false, errGuard
	case 1:
		return true, r.acked(ack)
	}
	return false, nil
}

func nextVersion(v string) int64 {
	n, _ := strconv.ParseInt(v, 10, 64)
	return n + 1
}

// holdsSlot reports whether sessions of the kind hold a session slot (sticky ones do not).
func holdsSlot(k session.Kind) bool { return k != session.KindSticky }

// endNote is the pub/sub message announcing an end to the other replicas.
type endNote struct {
	Origin  string          `json:"o"`
	Session session.Session `json:"s"`
}

// ended adds the end of stored-Active old (now ended as s) to m: the record is rewritten as s,
// leaves its instance's index and count, and the end is published.
func (r *Store) ended(m *mutation, old session.Session, s session.Session) {
	m.zrem(r.keyInstance(old.Service, old.Instance), old.ID)
	if holdsSlot(old.Kind) {
		m.hincr(r.keyCounts(old.Service), old.Instance, -1)
	}
	b, _ := json.Marshal(endNote{Origin: r.origin, Session: s})
	m.pubCh, m.pubMsg = r.channelEnds(), string(b)
}

// inserted adds the indexes of a new stored-Active record s to m.
func (r *Store) inserted(m *mutation, s session.Session) {
	m.zadd(r.keyExp(s.Service), ms(r.reapAt(s)), s.ID)
	m.zadd(r.keyIDs(s.Service), "0", s.ID)
	m.zadd(r.keyInstance(s.Service, s.Instance), "0", s.ID)
	if holdsSlot(s.Kind) {
		m.hincr(r.keyCounts(s.Service), s.Instance, 1)
	}
}

// announce calls the end handler for ends this handle made.
func (r *Store) announce(ended ...session.Session) {
	fn := r.onEnd.Load()
	for _, s := range ended {
		r.forget(hotKey{s.Service, s.ID})
		if fn != nil {
			s.Attributes = session.CloneAttributes(s.Attributes)
			(*fn)(session.EndEvent{Session: s, Local: true})
		}
	}
}

// read returns the record (uncached: writes decide on the primary's current state).
func (r *Store) read(ctx context.Context, service, id string) (stored, error) {
	m, err := r.c.Do(ctx, r.c.B().Hgetall().Key(r.keySession(service, id)).Build()).AsStrMap()
	if err := r.check(err); err != nil {
		return stored{}, err
	}
	return decodeRecord(service, id, m)
}

// withTouch merges this handle's pending touch into a stored Active session, as Touch would
// have applied it.
func (r *Store) withTouch(s session.Session) session.Session {
	if s.Status != session.StatusActive {
		return s
	}
	k := hotKey{s.Service, s.ID}
	return touched(s, r.touchOf(k, r.cached(k)))
}

// touched applies a pending touch t (Unix ns, 0: none) to an Active session.
func touched(s session.Session, t int64) session.Session {
	if s.Status == session.StatusActive && t > s.LastSeen.UnixNano() && t < s.ExpiresAt().UnixNano() {
		s.LastSeen = nanos(t)
	}
	return s
}

// registerService records a service in Pservices (once per handle) before its first write.
// Pservices has no hash tag: on a Cluster it lives on one node, which may be down while the
// service's own node is up. So a registration that cannot reach Redis — within a quarter of
// the call timeout, leaving the write its time — does not fail the write: the service is
// queued and Run records it once Pservices' node answers (registerPending). Until then the
// reaper does not look at the service (a lapsed session keeps its slot: an overcount, never
// an undercount) and a List over all services leaves it out.
func (r *Store) registerService(ctx context.Context, service string) error {
	if _, ok := r.services.Load(service); ok {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, r.opTimeout/4)
	defer cancel()
	err := r.c.Do(rctx, r.c.B().Zadd().Key(r.keyServices()).Nx().ScoreMember().ScoreMember(0, service).Build()).Error()
	switch err := r.check(err); {
	case err == nil:
		r.services.Store(service, struct{}{})
		r.pendingServices.Delete(service)
		return nil
	case errors.Is(err, session.ErrStoreUnavailable) && ctx.Err() == nil:
		if _, queued := r.pendingServices.LoadOrStore(service, struct{}{}); !queued {
			r.log.Warn("redis store: could not record a service in the service list (its node is unreachable); its sessions are written, and Run records it once the node answers",
				"service", service, "key", r.keyServices(), "err", err)
		}
		return nil
	default:
		return err
	}
}

// registerPending records the services registerService queued (Run, every probe interval).
func (r *Store) registerPending(ctx context.Context) {
	r.pendingServices.Range(func(k, _ any) bool {
		ctx, cancel := r.bound(ctx)
		defer cancel()
		_ = r.registerService(ctx, k.(string))
		return ctx.Err() == nil
	})
}

// Create implements session.Store.
func (r *Store) Create(ctx context.Context, s session.Session) error { return r.create(ctx, s, "") }

// create is Create, converting reservation member ("" none) into the new session's slot.
func (r *Store) create(ctx context.Context, s session.Session, member string) error {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return err
	}
	s, err := session.PrepareCreate(r.callerTimes(s), r.now())
	if err != nil {
		return err
	}
	if err := r.registerService(ctx, s.Service); err != nil {
		return fmt.Errorf("create session %q: %w", s.ID, err)
	}
	for i := range casAttempts {
		ok, prev, err := r.tryCreate(ctx, s, nil, member, i == 0)
		if err != nil {
			r.retract(s.Service, s.ID, err)
			return fmt.Errorf("create session %q: %w", s.ID, err)
		}
		if ok {
			if prev != nil {
				r.announce(*prev)
			}
			return nil
		}
	}
	return fmt.Errorf("create session %q: %w: too many concurrent changes", s.ID, session.ErrStoreUnavailable)
}

// callerTimes translates the times a caller set on a new session (on the replica's clock) into
// Redis's.
func (r *Store) callerTimes(s session.Session) session.Session {
	if !s.Created.IsZero() {
		s.Created = r.fromReplica(s.Created)
	}
	if !s.LastSeen.IsZero() {
		s.LastSeen = r.fromReplica(s.LastSeen)
	}
	return s
}

// tryCreate makes one attempt at inserting s; place, when set, turns the write into a
// placement (see SlotStore); rsv, when set, is a reservation whose slot s takes over. It
// returns the lapsed session it replaced, if any. blind skips reading the current record and
// bets that there is none (a fresh id): one round trip instead of two; if a record exists,
// the version check fails the attempt and the next one reads it.
func (r *Store) tryCreate(ctx context.Context, s session.Session, place *placement, rsv string, blind bool) (bool, *session.Session, error) {
	now := s.LastModified
	var old stored
	if !blind {
		var err error
		if old, err = r.read(ctx, s.Service, s.ID); err != nil {
			return false, nil, err
		}
	}
	var prev *session.Session
	if old.present() {
		o := r.withTouch(old.s)
		v := view(o, now)
		retained := r.retainedView(v, now)
		switch {
		case v.Status == session.StatusActive:
			return false, nil, session.ErrExists
		case retained && o.DisableReuse:
			return false, nil, session.ErrReuseDisabled
		}
		if o.Status == session.StatusActive {
			e := v // lapsed: ended as Expired at its ExpiresAt
			prev = &e
		}
	}
	m := r.newMutation(s.Service, s.ID, old.v)
	if prev != nil {
		r.ended(m, old.s, *prev)
		m.guard = lapsedBy(prev.Ended) // it has lapsed on Redis's clock too
	}
	if place != nil {
		return r.placeCreate(ctx, m, s, old, prev, place)
	}
	m.put = encodeFields(s, nextVersion(old.v))
	m.acked = true
	r.inserted(m, s)
	if rsv != "" {
		m.convert(r.keyReservations(s.Service), r.keyCounts(s.Service), rsv)
	}
	ok, err := r.apply(ctx, m)
	if errors.Is(err, errGuard) {
		return false, nil, session.ErrExists // Redis's clock says the old one is still live
	}
	if err != nil || !ok {
		return false, nil, err
	}
	r.remember(hotKey{s.Service, s.ID}, stored{s: s, v: strconv.FormatInt(nextVersion(old.v), 10)})
	return true, prev, nil
}

// Get implements session.Store. A record Redis's tracking vouches for is served from the replica cache
// (redis_cache.go): no Redis command, no lock. Otherwise it is read through the client-side
// cache, which also starts the tracking. While Redis is unreachable, the sessions this handle
// has read keep being served from its cache (see Store).
func (r *Store) Get(ctx context.Context, service, id string) (session.Session, error) {
	// A cancelled call is the caller's; one past its deadline (the decision's) is still served
	// what the cache knows.
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return session.Session{}, err
	}
	k := hotKey{service, id}
	e := r.cached(k)
	if e != nil {
		now := r.now()
		if rec, ok := r.vouched(e, now); ok {
			return r.viewKnown(e, rec, id, now)
		}
		if rec, ok := e.last(); ok && !r.up.Load() {
			// Redis is unreachable (Run probes it): the last record read keeps routing at
			// once, without waiting for a connection that is not there.
			return r.viewKnown(e, rec, id, now)
		}
	} else {
		e = r.entryFor(k)
	}
	parent := ctx
	gen, epoch, check := r.beginFill(e)
	ctx, cancel := r.bound(ctx)
	defer cancel()
	key := r.keySession(service, id)
	m, err := r.c.DoCache(ctx, r.c.B().Hgetall().Key(key).Cache(), r.cacheTTL).AsStrMap()
	vouch := err == nil
	if vouch && check {
		// This handle wrote the key and its invalidation has not come: serve what Redis
		// holds now, and trust the cached copy only if it is the same.
		var now map[string]string
		if now, err = r.c.Do(ctx, r.c.B().Hgetall().Key(key).Build()).AsStrMap(); err == nil {
			vouch = maps.Equal(now, m)
			m = now
		}
	}
	if err := r.check(err); err != nil {
		rec, ok := e.last()
		slow := errors.Is(err, context.DeadlineExceeded) && parent.Err() == nil
		if !ok || !errors.Is(err, session.ErrStoreUnavailable) && !slow {
			return session.Session{}, fmt.Errorf("get session %q: %w", id, err)
		}
		// Redis is unreachable or did not answer in time: the last record read keeps
		// routing (degraded mode).
		return r.viewKnown(e, rec, id, r.now())
	}
	rec, err := decodeRecord(service, id, m)
	if err != nil {
		return session.Session{}, fmt.Errorf("get session %q: %w", id, err)
	}
	if !rec.present() {
		r.forget(k)
		return session.Session{}, fmt.Errorf("get session %q: %w", id, session.ErrNotFound)
	}
	now := r.now()
	r.fill(e, rec, gen, epoch, vouch, now)
	return r.viewKnown(e, rec, id, now)
}

// viewKnown reports a record of entry e (nil: none) as Get does at now, with a private
// Attributes map.
func (r *Store) viewKnown(e *cacheEntry, rec stored, id string, now time.Time) (session.Session, error) {
	v := view(touched(rec.s, r.touchOf(hotKey{rec.s.Service, id}, e)), now)
	if !r.retainedView(v, now) {
		return session.Session{}, fmt.Errorf("get session %q: %w", id, session.ErrNotFound)
	}
	v.Attributes = session.CloneAttributes(v.Attributes)
	return v, nil
}

// Touch implements session.Store: the latest time per session is kept and written within TouchDelay
// by Run (or FlushTouches). It never waits for Redis, and takes a lock only the first time a
// session is touched after a flush.
func (r *Store) Touch(_ context.Context, service, id string, now time.Time) {
	n := r.fromReplica(now).UnixNano()
	k := hotKey{service, id}
	if e := r.entryFor(k); e != nil {
		r.touchEntry(e, n)
		return
	}
	r.touchMu.Lock()
	if n > r.touches[k] {
		r.touches[k] = n
	}
	r.overflow.Store(true)
	r.touchMu.Unlock()
}

// FlushTouches implements session.TouchFlusher: it writes every pending touch that still applies (the
// session is Active, the touch is later than its LastSeen and before its deadline).
func (r *Store) FlushTouches(ctx context.Context) error {
	pending := r.pendingTouches()
	if len(pending) == 0 {
		return nil
	}
	keys := make([]hotKey, 0, len(pending))
	for k := range pending {
		keys = append(keys, k)
	}
	var errs []error
	for attempt := 0; len(keys) > 0 && attempt < casAttempts; attempt++ {
		reads := make([]rueidis.Completed, len(keys))
		for i, k := range keys {
			reads[i] = r.c.B().Hgetall().Key(r.keySession(k.service, k.id)).Build()
		}
		var execs []rueidis.LuaExec
		var execKeys []hotKey
		for i, res := range r.c.DoMulti(ctx, reads...) {
			k := keys[i]
			m, err := res.AsStrMap()
			if err := r.check(err); err != nil {
				errs = append(errs, err)
				continue
			}
			rec, err := decodeRecord(k.service, k.id, m)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			t := pending[k]
			s := rec.s
			if !rec.present() || s.Status != session.StatusActive || t <= s.LastSeen.UnixNano() || t >= s.ExpiresAt().UnixNano() {
				continue // ended, lapsed, or already seen later: the touch does nothing
			}
			s.LastSeen = nanos(t)
			mu := r.newMutation(k.service, k.id, rec.v)
			mu.put = encodeFields(s, nextVersion(rec.v))
			mu.zadd(r.keyExp(k.service), ms(r.reapAt(s)), k.id)
			execs = append(execs, rueidis.LuaExec{Keys: mu.keys, Args: mu.args(r.scriptNow())})
			execKeys = append(execKeys, k)
		}
		keys = keys[:0]
		for i, res := range casScript.ExecMulti(ctx, r.c, execs...) {
			r.wrote(execKeys[i])
			n, err := res.AsInt64()
			if err := r.check(err); err != nil {
				errs = append(errs, err)
				continue
			}
			if n == 0 {
				keys = append(keys, execKeys[i]) // changed meanwhile: judge it again
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.requeueTouches(pending) // retried at the next flush
		return fmt.Errorf("flush touches: %w", err)
	}
	return nil
}

// Update implements session.Store. fn may run more than once when another handle changes the session
// meanwhile.
func (r *Store) Update(ctx context.Context, service, id string, fn func(*session.Session) error) (session.Session, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return session.Session{}, err
	}
	for range casAttempts {
		now := r.now()
		old, err := r.read(ctx, service, id)
		if err != nil {
			return session.Session{}, fmt.Errorf("update session %q: %w", id, err)
		}
		if !old.present() {
			return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrNotFound)
		}
		cur := r.withTouch(old.s)
		v := view(cur, now)
		switch {
		case !r.retainedView(v, now):
			return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrNotFound)
		case cur.Status != session.StatusActive:
			return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrEnded)
		case v.Status != session.StatusActive:
			return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrExpired)
		}
		v.Attributes = session.CloneAttributes(v.Attributes)
		if err := fn(&v); err != nil {
			return session.Session{}, fmt.Errorf("update session %q: %w", id, err)
		}
		v, err = session.PrepareUpdate(id, cur, v, now)
		if err != nil {
			return session.Session{}, err
		}
		m := r.newMutation(service, id, old.v)
		m.put = encodeFields(v, nextVersion(old.v))
		m.acked = true
		m.zadd(r.keyExp(service), ms(r.reapAt(v)), id)
		if v.Instance != cur.Instance {
			m.zrem(r.keyInstance(service, cur.Instance), id)
			m.zadd(r.keyInstance(service, v.Instance), "0", id)
		}
		if holdsSlot(cur.Kind) && (v.Instance != cur.Instance || !holdsSlot(v.Kind)) {
			m.hincr(r.keyCounts(service), cur.Instance, -1)
		}
		if holdsSlot(v.Kind) && (v.Instance != cur.Instance || !holdsSlot(cur.Kind)) {
			m.hincr(r.keyCounts(service), v.Instance, 1)
		}
		m.guard = aliveAt(cur.ExpiresAt())
		ok, err := r.apply(ctx, m)
		if errors.Is(err, errGuard) {
			return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrExpired)
		}
		if err != nil {
			return session.Session{}, fmt.Errorf("update session %q: %w", id, err)
		}
		if ok {
			v.Attributes = session.CloneAttributes(v.Attributes)
			return v, nil
		}
	}
	return session.Session{}, fmt.Errorf("update session %q: %w: too many concurrent changes", id, session.ErrStoreUnavailable)
}

// End implements session.Store.
func (r *Store) End(ctx context.Context, service, id string, status session.Status, now time.Time) (session.Session, error) {
	return r.end(ctx, service, id, status, now, true)
}

// end is End; announce false leaves this handle's end handler out (a retracted create: its
// caller never had the session).
func (r *Store) end(ctx context.Context, service, id string, status session.Status, now time.Time, announce bool) (session.Session, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return session.Session{}, err
	}
	if status != session.StatusExpired && status != session.StatusTerminated {
		return session.Session{}, fmt.Errorf("end session %q: %w: status %q", id, session.ErrInvalid, status)
	}
	now = r.fromReplica(now)
	// lapsedAt, once set, is Redis's word on whether the session had lapsed (a guard failed):
	// the next attempt follows it.
	var lapsedAt *bool
	for range casAttempts {
		old, cur, err := r.readActive(ctx, service, id, now)
		if err != nil {
			return session.Session{}, fmt.Errorf("end session %q: %w", id, err)
		}
		s, exp := cur, cur.ExpiresAt()
		lapsed := !now.Before(exp)
		if lapsedAt != nil {
			lapsed = *lapsedAt
		}
		m := r.newMutation(service, id, old.v)
		if lapsed {
			s.Status, s.Ended = session.StatusExpired, exp
			m.guard = lapsedBy(exp)
		} else {
			s.Status, s.Ended = status, now
			if s.Ended.After(exp) {
				s.Ended = exp // Redis's clock had it live at now: it ends live
			}
			m.guard = aliveAt(exp)
		}
		m.put = encodeFields(s, nextVersion(old.v))
		m.zadd(r.keyExp(service), ms(r.reapAt(s)), id)
		r.ended(m, cur, s)
		ok, err := r.apply(ctx, m)
		if errors.Is(err, errGuard) {
			flip := !lapsed
			lapsedAt = &flip
			continue
		}
		if err != nil {
			return session.Session{}, fmt.Errorf("end session %q: %w", id, err)
		}
		if !ok {
			continue
		}
		if announce {
			r.announce(s)
		} else {
			r.forget(hotKey{s.Service, s.ID})
		}
		if lapsed && status != session.StatusExpired {
			return session.Session{}, fmt.Errorf("end session %q: %w: %w", id, session.ErrEnded, session.ErrExpired)
		}
		s.Attributes = session.CloneAttributes(s.Attributes)
		return s, nil
	}
	return session.Session{}, fmt.Errorf("end session %q: %w: too many concurrent changes", id, session.ErrStoreUnavailable)
}

// readActive reads the record of a session to end (uncached) and its view with this handle's
// pending touch: ErrNotFound when it is absent or past retention, ErrEnded when it has ended.
func (r *Store) readActive(ctx context.Context, service, id string, now time.Time) (stored, session.Session, error) {
	old, err := r.read(ctx, service, id)
	if err != nil {
		return stored{}, session.Session{}, err
	}
	if !old.present() {
		return stored{}, session.Session{}, session.ErrNotFound
	}
	cur := r.withTouch(old.s)
	if !r.retainedView(view(cur, now), now) {
		return stored{}, session.Session{}, session.ErrNotFound
	}
	if cur.Status != session.StatusActive {
		return stored{}, session.Session{}, session.ErrEnded
	}
	return old, cur, nil
}

// loadMany reads records of one service (uncached) and returns the present ones in order.
func (r *Store) loadMany(ctx context.Context, service string, ids []string) ([]session.Session, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]rueidis.Completed, len(ids))
	for i, id := range ids {
		cmds[i] = r.c.B().Hgetall().Key(r.keySession(service, id)).Build()
	}
	out := make([]session.Session, 0, len(ids))
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		m, err := res.AsStrMap()
		if err := r.check(err); err != nil {
			return nil, err
		}
		rec, err := decodeRecord(service, ids[i], m)
		if err != nil {
			return nil, err
		}
		if rec.present() {
			out = append(out, r.withTouch(rec.s))
		}
	}
	return out, nil
}

// List implements session.Store.
func (r *Store) List(ctx context.Context, f session.Filter, pageToken string, limit int) ([]session.Session, string, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	after, err := session.DecodePageToken(pageToken)
	if err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		limit = session.DefaultListLimit
	}
	limit = min(limit, session.MaxListLimit)
	services := []string{f.Service}
	if f.Service == "" {
		services, err = r.c.Do(ctx, r.c.B().Zrange().Key(r.keyServices()).Min("-").Max("+").Bylex().Build()).AsStrSlice()
		if err := r.check(err); err != nil {
			return nil, "", fmt.Errorf("list sessions: %w", err)
		}
	}
	now := r.now()
	var out []session.Session
	for _, svc := range services {
		if after.Set && svc < after.Service {
			continue
		}
		idx := r.keyIDs(svc)
		if f.Instance != "" && f.Status == session.StatusActive {
			idx = r.keyInstance(svc, f.Instance) // stored-Active sessions of the instance
		}
		lo := "-"
		if after.Set && svc == after.Service {
			lo = "(" + after.ID
		}
		if f.ID != "" {
			if (after.Set && svc == after.Service && f.ID <= after.ID) || f.ID == "" {
				continue
			}
			lo = "[" + f.ID
		}
		for {
			if err := ctx.Err(); err != nil {
				return nil, "", err
			}
			cmd := r.c.B().Zrange().Key(idx).Min(lo).Max("+").Bylex().Limit(0, int64(limit)+1).Build()
			if f.ID != "" {
				cmd = r.c.B().Zrange().Key(idx).Min(lo).Max("[" + f.ID).Bylex().Build()
			}
			ids, err := r.c.Do(ctx, cmd).AsStrSlice()
			if err := r.check(err); err != nil {
				return nil, "", fmt.Errorf("list sessions: %w", err)
			}
			recs, err := r.loadMany(ctx, svc, ids)
			if err != nil {
				return nil, "", fmt.Errorf("list sessions: %w", err)
			}
			for _, s := range recs {
				v := view(s, now)
				if !r.retainedView(v, now) || (f.ID != "" && v.ID != f.ID) || (f.Instance != "" && v.Instance != f.Instance) || !f.Match(v) {
					continue
				}
				if len(out) == limit {
					last := out[len(out)-1]
					return out, session.EncodePageToken(last.Service, last.ID), nil
				}
				v.Attributes = session.CloneAttributes(v.Attributes)
				out = append(out, v)
			}
			if f.ID != "" || len(ids) <= limit {
				break
			}
			lo = "(" + ids[len(ids)-1]
		}
	}
	return out, "", nil
}

// ActiveByInstance implements session.Store.
func (r *Store) ActiveByInstance(ctx context.Context, service, instance string) ([]session.Session, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := r.c.Do(ctx, r.c.B().Zrange().Key(r.keyInstance(service, instance)).Min("-").Max("+").Bylex().Build()).AsStrSlice()
	if err := r.check(err); err != nil {
		return nil, fmt.Errorf("sessions of %s/%s: %w", service, instance, err)
	}
	recs, err := r.loadMany(ctx, service, ids)
	if err != nil {
		return nil, fmt.Errorf("sessions of %s/%s: %w", service, instance, err)
	}
	out := recs[:0]
	for _, s := range recs {
		if s.Status == session.StatusActive && s.Instance == instance {
			out = append(out, s)
		}
	}
	return out, nil
}
