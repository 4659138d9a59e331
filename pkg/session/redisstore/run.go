package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/pkg/redissub"
	"github.com/tether-dev/tether/pkg/session"
)

func netDialer(timeout time.Duration) net.Dialer {
	return net.Dialer{Timeout: timeout, KeepAlive: time.Second}
}

// Run flushes touches every TouchDelay, renews this handle's reservations every reservation
// TTL/3, ends lapsed sessions, frees expired reservations and purges old records every reap
// interval (one replica at a time: it holds the reaper lease), and delivers end notifications
// made by other replicas to the end handler. It blocks until ctx ends, flushes the touches
// still pending, and returns nil. Only one Run may be active per store at a time.
//
// Each of its steps ends by runTimeout (a step cut short is taken again at its next tick): a
// hung Redis (SIGSTOP, a blackholed network) delays the loop's other work — the probe that
// notices Redis is back, the next flush, the reservations' renewal — by at most that, not by
// the dial timeout that bounds a call without a deadline.
func (r *Store) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("redisstore: Store.Run is already running")
	}
	defer r.running.Store(false)
	var wg sync.WaitGroup
	wg.Go(func() { r.subscribe(ctx) })
	touch := time.NewTicker(r.touchDelay)
	defer touch.Stop()
	reap := time.NewTicker(r.reapInterval)
	defer reap.Stop()
	probe := time.NewTicker(250 * time.Millisecond)
	defer probe.Stop()
	renew := time.NewTicker(r.rsvTTL / 3)
	defer renew.Stop()
	resync := time.NewTicker(clockSync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := r.FlushTouches(fctx); err != nil {
				r.log.Warn("redis store: final touch flush failed", "err", err)
			}
			cancel()
			wg.Wait()
			return nil
		case <-renew.C:
			r.step(ctx, r.renewReservations)
		case <-resync.C:
			r.step(ctx, r.resyncClock)
		case <-probe.C:
			r.probe(ctx)
			r.registerPending(ctx)
		case <-touch.C:
			r.step(ctx, r.flushStep)
		case <-reap.C:
			r.step(ctx, r.reapStep)
		}
	}
}

// minRunTimeout is the least a step of Run may take (see runTimeout).
const minRunTimeout = time.Second

// runTimeout bounds each step of Run: the store's call timeout, and at least minRunTimeout (a
// step may make many calls — a flush of every pending touch, a reaper pass — and is not on a
// request's path; tether serve's call timeout is a quarter of Envoy's message_timeout).
func (r *Store) runTimeout() time.Duration { return max(r.opTimeout, minRunTimeout) }

// step runs one step of Run with ctx bounded by runTimeout.
func (r *Store) step(ctx context.Context, fn func(context.Context)) {
	ctx, cancel := context.WithTimeout(ctx, r.runTimeout())
	defer cancel()
	fn(ctx)
}

// resyncClock is Run's periodic reading of Redis's clock.
func (r *Store) resyncClock(ctx context.Context) {
	if err := r.syncClock(ctx); err != nil && !errors.Is(err, context.Canceled) {
		r.log.Debug("redis store: reading Redis's clock failed; the last reading stands", "err", err)
	}
}

// flushStep is Run's periodic touch flush (and the sweep of forgotten cache entries).
func (r *Store) flushStep(ctx context.Context) {
	r.sweepGone()
	if err := r.FlushTouches(ctx); err != nil && !errors.Is(err, context.Canceled) {
		r.log.Debug("redis store: touch flush failed; retrying at the next one", "err", err)
	}
}

// reapStep is Run's periodic reaper pass, on the replica holding the reaper lease.
func (r *Store) reapStep(ctx context.Context) {
	lead, err := r.holdLease(ctx, r.keyReaper(), 3*r.reapInterval)
	if err != nil || !lead {
		return
	}
	ended, purged, err := r.Reap(ctx)
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		r.log.Warn("redis store: reaping sessions failed", "err", err)
	case ended+purged > 0:
		r.log.Debug("redis store: reaped sessions", "ended", ended, "purged", purged)
	}
}

// leaseScript takes or renews a lease held under ARGV[1] for ARGV[2] ms; 1 if held.
var leaseScript = rueidis.NewLuaScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// holdLease takes or renews the named lease for this handle.
func (r *Store) holdLease(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	n, err := leaseScript.Exec(ctx, r.c, []string{key}, []string{r.origin, strconv.FormatInt(ttl.Milliseconds(), 10)}).AsInt64()
	if err := r.check(err); err != nil {
		return false, err
	}
	return n == 1, nil
}

// HoldLease takes or renews a named lease (key prefix added) for ttl and reports whether this
// handle holds it: one replica at a time does what the lease guards (e.g. health checks).
func (r *Store) HoldLease(ctx context.Context, name string, ttl time.Duration) (bool, error) {
	return r.holdLease(ctx, r.prefix+"lease:"+name, ttl)
}

// releaseScript deletes a lease if ARGV[1] holds it; 1 if it did.
var releaseScript = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// ReleaseLease gives up a named lease this handle holds (a graceful stop), so that another
// replica can take it at once rather than when it lapses. A lease another handle holds is left.
func (r *Store) ReleaseLease(ctx context.Context, name string) error {
	return r.check(releaseScript.Exec(ctx, r.c, []string{r.prefix + "lease:" + name}, []string{r.origin}).Error())
}

// Reap ends every Active session that has lapsed by now minus TouchDelay (so a touch still on
// its way from another replica is not overtaken; Ended is still its ExpiresAt) and purges ended
// records older than the retention. Run calls it on the replica holding the reaper lease; tests
// may call it directly.
func (r *Store) Reap(ctx context.Context) (ended, purged int, err error) {
	services, err := r.c.Do(ctx, r.c.B().Zrange().Key(r.keyServices()).Min("-").Max("+").Bylex().Build()).AsStrSlice()
	if err := r.check(err); err != nil {
		return 0, 0, fmt.Errorf("reap sessions: %w", err)
	}
	for _, svc := range services {
		e, p, err := r.reapService(ctx, svc)
		ended, purged = ended+e, purged+p
		if err != nil {
			return ended, purged, err
		}
	}
	return ended, purged, nil
}

func (r *Store) reapService(ctx context.Context, svc string) (ended, purged int, err error) {
	if err := r.sweepReservations(ctx, svc); err != nil {
		return 0, 0, fmt.Errorf("reap reservations: %w", err)
	}
	now := r.now()
	judged := now.Add(-r.touchDelay)
	for ctx.Err() == nil {
		ids, err := r.c.Do(ctx, r.c.B().Zrange().Key(r.keyExp(svc)).Min("-inf").Max(ms(now)).Byscore().Limit(0, redisReapBatch).Build()).AsStrSlice()
		if err := r.check(err); err != nil {
			return ended, purged, fmt.Errorf("reap sessions: %w", err)
		}
		if len(ids) == 0 {
			return ended, purged, nil
		}
		progress := false
		for _, id := range ids {
			did, gone, err := r.reapOne(ctx, svc, id, now, judged)
			if err != nil {
				return ended, purged, fmt.Errorf("reap sessions: %w", err)
			}
			if did {
				progress = true
			}
			switch gone {
			case 1:
				ended++
			case 2:
				purged++
			}
		}
		if !progress || len(ids) < redisReapBatch {
			return ended, purged, nil
		}
	}
	return ended, purged, ctx.Err()
}

// reapOne looks at one due record: it ends it (gone 1), purges it (gone 2), or moves its index
// entry to when it is really due. did reports that the index entry moved or went away.
func (r *Store) reapOne(ctx context.Context, svc, id string, now, judged time.Time) (did bool, gone int, err error) {
	for range casAttempts {
		old, err := r.read(ctx, svc, id)
		if err != nil {
			return false, 0, err
		}
		if !old.present() {
			err := r.c.Do(ctx, r.c.B().Zrem().Key(r.keyExp(svc)).Member(id).Build()).Error()
			return true, 0, r.check(err)
		}
		s := r.withTouch(old.s)
		m := r.newMutation(svc, id, old.v)
		switch {
		case s.Status == session.StatusActive && !judged.Before(s.ExpiresAt()):
			e := s
			e.Status, e.Ended = session.StatusExpired, s.ExpiresAt()
			m.put = encodeFields(e, nextVersion(old.v))
			m.zadd(r.keyExp(svc), ms(r.reapAt(e)), id)
			r.ended(m, s, e)
			m.guard = lapsedBy(s.ExpiresAt().Add(r.touchDelay))
			ok, err := r.apply(ctx, m)
			if errors.Is(err, errGuard) {
				return false, 0, nil // not yet on Redis's clock: the next reap looks again
			}
			if err != nil {
				return false, 0, err
			}
			if ok {
				r.announce(e)
				return true, 1, nil
			}
		case s.Status != session.StatusActive && !now.Before(s.Ended.Add(r.retention)):
			m.zrem(r.keyExp(svc), id)
			m.zrem(r.keyIDs(svc), id)
			m.guard = lapsedBy(s.Ended.Add(r.retention))
			ok, err := r.apply(ctx, m)
			if errors.Is(err, errGuard) {
				return false, 0, nil
			}
			if err != nil {
				return false, 0, err
			}
			if ok {
				return true, 2, nil
			}
		default:
			// Touched in time (or within the touch grace): the index moves to the real time.
			at := r.reapAt(s)
			if s.Status == session.StatusActive {
				at = at.Add(r.touchDelay) // when it is judged lapsed
			}
			if !at.After(now) {
				at = now.Add(r.reapInterval)
			}
			err := r.c.Do(ctx, r.c.B().Zadd().Key(r.keyExp(svc)).Xx().Gt().ScoreMember().ScoreMember(float64(at.UnixMilli()), id).Build()).Error()
			return true, 0, r.check(err)
		}
	}
	return false, 0, nil
}

// subscribe delivers other replicas' end notifications until ctx ends, reconnecting as needed.
// Notifications published while no subscription stands are missed (they are best effort; see
// Store).
func (r *Store) subscribe(ctx context.Context) {
	redissub.Follow(ctx, r.c, r.channelEnds(), redissub.Hooks{
		Message:    r.onEndNote,
		Subscribed: func() { r.subOnce.Do(func() { close(r.subscribed) }) },
		Failed:     func(err error) { _ = r.check(err) },
	})
}

func (r *Store) onEndNote(msg rueidis.PubSubMessage) {
	var n endNote
	if err := json.Unmarshal([]byte(msg.Message), &n); err != nil {
		r.log.Warn("redis store: malformed end notification", "err", err)
		return
	}
	if n.Origin == r.origin {
		return // announced locally already
	}
	r.forget(hotKey{n.Session.Service, n.Session.ID})
	if fn := r.onEnd.Load(); fn != nil {
		(*fn)(session.EndEvent{Session: n.Session, Local: false})
	}
}

// Subscribed is closed once Run's first subscription to end notifications stands: from then
// on this handle hears the ends other handles make.
func (r *Store) Subscribed() <-chan struct{} { return r.subscribed }
