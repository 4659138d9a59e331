package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/session"
)

// DefaultReservationTTL is how long a reservation outlives its last renewal (see
// WithReservationTTL).
const DefaultReservationTTL = 10 * time.Second

// WithReservationTTL sets how long a reservation (Reserve) stays counted after the
// handle holding it stops renewing it (default DefaultReservationTTL): a dead replica's
// reservations free their session slots within it. Run renews the live ones every d/3.
func WithReservationTTL(d time.Duration) Option {
	return func(r *Store) {
		if d > 0 {
			r.rsvTTL = d
		}
	}
}

// rsvSweep drops the expired reservations of KEYS[2] (score: expiry in ms ≤ now on Redis's
// clock, luaNow) and gives their slots back in the counts hash KEYS[1]. Members are instance
// "|" token.
const rsvSweep = luaNow + `
local nowMs = math.floor(now / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', nowMs)
for _, m in ipairs(gone) do
  redis.call('ZREM', KEYS[2], m)
  redis.call('HINCRBY', KEYS[1], string.match(m, '^(.*)|[^|]*$'), -1)
end
`

// reserveScript sweeps expired reservations, then picks the instance by the placement rule
// (SlotStore) over the counts, which include the live reservations, and reserves a slot there.
//
//	KEYS: counts, reservations
//	ARGV: time ("": TIME), TTL (ms), token, n, n × (instance, pool "1" active | "2" standby, cap)
//
// It returns {-1, 0} without room, else {index, pool}.
var reserveScript = rueidis.NewLuaScript(rsvSweep + pickLua(4, 1) + `
redis.call('HINCRBY', KEYS[1], inst, 1)
redis.call('ZADD', KEYS[2], nowMs + tonumber(ARGV[2]), inst .. '|' .. ARGV[3])
return {best, bestPool}
`)

// rsvReleaseScript frees one reservation (KEYS: counts, reservations; ARGV: member) if it is
// still held (an expired one was freed by a sweep already).
var rsvReleaseScript = rueidis.NewLuaScript(`
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], string.match(ARGV[1], '^(.*)|[^|]*$'), -1)
  return 1
end
return 0
`)

// sweepScript drops the expired reservations of one service (KEYS: counts, reservations;
// ARGV: time, "" for TIME).
var sweepScript = rueidis.NewLuaScript(rsvSweep + `return #gone`)

func (r *Store) keyReservations(service string) string { return r.tag(service) + ":rsv" }

// Reserve holds a provisional session slot on the instance the placement rule picks among c
// (SlotStore), in one atomic step against every replica's sessions and reservations: the
// session slots of an instance never exceed its cap counting both. ErrNoRoom if no candidate
// has room. The reservation is renewed by Run until CreateReserved or Release; if this handle
// stops (its process dies), it expires after the reservation TTL.
func (r *Store) Reserve(ctx context.Context, service string, c []session.PlaceCandidate) (session.Reservation, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if err := session.CheckName("service", service); err != nil {
		return session.Reservation{}, err
	}
	if len(c) == 0 {
		return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: %w", service, session.ErrNoRoom)
	}
	args := make([]string, 0, 4+3*len(c))
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: %w", service, err)
	}
	token := hex.EncodeToString(b)
	args = append(args, r.scriptNow(), strconv.FormatInt(r.rsvTTL.Milliseconds(), 10), token, strconv.Itoa(len(c)))
	for _, x := range c {
		if err := session.CheckName("instance", x.Instance); err != nil {
			return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: %w", service, err)
		}
		pool := "1"
		if x.Standby {
			pool = "2"
		}
		args = append(args, x.Instance, pool, strconv.Itoa(x.Cap))
	}
	if err := r.registerService(ctx, service); err != nil {
		return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: %w", service, err)
	}
	res, err := reserveScript.Exec(ctx, r.c, []string{r.keyCounts(service), r.keyReservations(service)}, args).AsIntSlice()
	if err := r.check(err); err != nil {
		return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: %w", service, err)
	}
	if len(res) != 2 {
		return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: unexpected reply %v", service, res)
	}
	if res[0] < 0 {
		return session.Reservation{}, fmt.Errorf("reserve a session slot of %q: %w", service, session.ErrNoRoom)
	}
	inst := c[res[0]-1].Instance
	rsv := session.Reservation{Service: service, Instance: inst, ScaleOut: res[1] == 2, Token: inst + "|" + token}
	r.rsvs.Store(rsv.Token, rsv)
	return rsv, nil
}

// Release frees a reservation that CreateReserved did not convert (idempotent; a zero
// Reservation does nothing). If Redis cannot be reached, the reservation expires after the
// reservation TTL instead.
func (r *Store) Release(ctx context.Context, rsv session.Reservation) error {
	if !rsv.Held() {
		return nil
	}
	r.rsvs.Delete(rsv.Token)
	ctx, cancel := r.bound(ctx)
	defer cancel()
	err := rsvReleaseScript.Exec(ctx, r.c, []string{r.keyCounts(rsv.Service), r.keyReservations(rsv.Service)}, []string{rsv.Token}).Error()
	if err := r.check(err); err != nil {
		return fmt.Errorf("release a session slot of %q: %w", rsv.Service, err)
	}
	return nil
}

// CreateReserved is Create for the session a reservation was made for: the session takes the
// reservation's slot, in the same atomic step, on s.Instance (which may differ from the
// reserved instance: the data plane served another; the slot moves with it, even above that
// instance's cap, as the session lives there). If the reservation had already expired the
// session still counts on its instance. On error the reservation is still held (Release it).
func (r *Store) CreateReserved(ctx context.Context, s session.Session, rsv session.Reservation) error {
	if !rsv.Held() || rsv.Service != s.Service {
		return fmt.Errorf("create session %q: %w: no reservation of service %q", s.ID, session.ErrInvalid, s.Service)
	}
	if err := r.create(ctx, s, rsv.Token); err != nil {
		return err
	}
	r.rsvs.Delete(rsv.Token)
	return nil
}

// ReservationCount returns the reservations recorded for a service (expired ones not yet
// swept included): for tests and operators.
func (r *Store) ReservationCount(ctx context.Context, service string) (int, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	n, err := r.c.Do(ctx, r.c.B().Zcard().Key(r.keyReservations(service)).Build()).AsInt64()
	if err := r.check(err); err != nil {
		return 0, err
	}
	return int(n), nil
}

// renewScript pushes back the expiry of reservations to TTL after now on Redis's clock (ZADD
// XX: one that was swept meanwhile stays gone). KEYS: reservations; ARGV: time ("": TIME),
// TTL (ms), members.
var renewScript = rueidis.NewLuaScript(luaNow + `
local exp = math.floor(now / 1000) + tonumber(ARGV[2])
for i = 3, #ARGV do redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[i]) end
return 0
`)

// renewReservations pushes back the expiry of every reservation this handle holds.
func (r *Store) renewReservations(ctx context.Context) {
	now, ttl := r.scriptNow(), strconv.FormatInt(r.rsvTTL.Milliseconds(), 10)
	byService := map[string][]string{}
	r.rsvs.Range(func(_, v any) bool {
		rsv := v.(session.Reservation)
		if byService[rsv.Service] == nil {
			byService[rsv.Service] = []string{now, ttl}
		}
		byService[rsv.Service] = append(byService[rsv.Service], rsv.Token)
		return true
	})
	if len(byService) == 0 {
		return
	}
	execs := make([]rueidis.LuaExec, 0, len(byService))
	for svc, args := range byService {
		execs = append(execs, rueidis.LuaExec{Keys: []string{r.keyReservations(svc)}, Args: args})
	}
	ctx, cancel := r.bound(ctx)
	defer cancel()
	for _, res := range renewScript.ExecMulti(ctx, r.c, execs...) {
		if err := r.check(res.Error()); err != nil {
			r.log.Warn("redis store: renewing a session-slot reservation failed; it expires after the reservation TTL", "err", err)
			return
		}
	}
}

// sweepReservations drops a service's expired reservations (a dead replica's).
func (r *Store) sweepReservations(ctx context.Context, service string) error {
	err := sweepScript.Exec(ctx, r.c, []string{r.keyCounts(service), r.keyReservations(service)}, []string{r.scriptNow()}).Error()
	return r.check(err)
}
