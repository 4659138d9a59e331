package session

import (
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// The replica cache is what one RedisStore knows of the sessions it has read: per session, the
// last record, whether Redis's tracking still vouches for it, and this handle's pending touch.
//
// A record read through the client-side cache (DoCache: CLIENT TRACKING, OPTIN) is vouched for
// until Redis sends an invalidation for its key, or until the connection it was tracked on
// breaks (every record then stops being vouched for at once: the epoch moves on), or until
// the cache TTL passes. A vouched record is served with no Redis command and no lock: a
// request for an existing session costs one map probe and a few atomic loads, and the store
// sends Redis nothing for it (touches are batched; see FlushTouches).
//
// A fill (a read that may vouch for a record) and an invalidation of the same key are ordered
// by the entry's mutex and generation: the fill notes the generation before it reads and keeps
// the record vouched only if no invalidation came in between. rueidis drops its own copy
// before it calls the invalidation hook, so a fill that starts after the hook ran reads
// Redis's current record. A record that is not vouched for (written by this handle, or
// invalidated) is still kept: while Redis is unreachable it keeps the session routing.

// cacheEntry is one session in a RedisStore's cache. Its key strings are private copies.
type cacheEntry struct {
	k     hotKey
	mu    sync.Mutex // orders fills against invalidations
	gen   uint64     // guarded by mu: how many invalidations the key has had
	cur   atomic.Pointer[cachedRecord]
	touch atomic.Int64 // this handle's latest touch, Unix ns (0: none)
	dirty atomic.Bool  // the touch is queued for the next flush (RedisStore.dirty)
}

// cachedRecord is an immutable snapshot of what an entry knows.
type cachedRecord struct {
	rec   stored
	epoch uint64 // the cache epoch the record was vouched in; 0: not vouched (known only)
	until int64  // Unix ns after which it is read again even without an invalidation
}

// cached returns the entry of k, or nil. It takes no lock and does not allocate.
func (r *RedisStore) cached(k hotKey) *cacheEntry {
	if v, ok := r.entries.Load(k); ok {
		return v.(*cacheEntry)
	}
	return nil
}

// entryFor returns the entry of k, making one unless the cache holds maxKnown entries (then
// nil: the caller goes without).
func (r *RedisStore) entryFor(k hotKey) *cacheEntry {
	if e := r.cached(k); e != nil {
		return e
	}
	if r.nEntries.Load() >= maxKnown {
		return nil
	}
	k = hotKey{strings.Clone(k.service), strings.Clone(k.id)} // never pin a caller's buffer
	v, loaded := r.entries.LoadOrStore(k, &cacheEntry{k: k})
	if !loaded {
		r.nEntries.Add(1)
	}
	return v.(*cacheEntry)
}

// vouched returns the entry's record if the cache may serve it without asking Redis at now.
func (r *RedisStore) vouched(e *cacheEntry, now time.Time) (stored, bool) {
	c := e.cur.Load()
	if c == nil || c.epoch != r.epoch.Load() || now.UnixNano() >= c.until {
		return stored{}, false
	}
	return c.rec, true
}

// last returns the entry's record, vouched or not (for degraded mode); false if none.
func (e *cacheEntry) last() (stored, bool) {
	if e == nil {
		return stored{}, false
	}
	c := e.cur.Load()
	if c == nil {
		return stored{}, false
	}
	return c.rec, true
}

// generation returns the entry's invalidation count, to pass to fill (0 for a nil entry).
func (e *cacheEntry) generation() uint64 {
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// fill keeps rec, read through the client-side cache after generation gen and epoch epoch
// were noted, as the entry's record: vouched for if no invalidation has come since.
func (r *RedisStore) fill(e *cacheEntry, rec stored, gen, epoch uint64, now time.Time) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := &cachedRecord{rec: rec}
	if e.gen == gen {
		c.epoch, c.until = epoch, now.Add(r.cacheTTL).UnixNano()
	}
	e.cur.Store(c)
}

// remember keeps rec, just written by this handle, as the last known record of k (not vouched
// for: the write ended Redis's tracking of the key, so the next Get reads it again).
func (r *RedisStore) remember(k hotKey, rec stored) {
	e := r.entryFor(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	e.gen++
	e.cur.Store(&cachedRecord{rec: rec})
	e.mu.Unlock()
}

// forget drops what the cache knows of k (its pending touch, if any, is still flushed).
func (r *RedisStore) forget(k hotKey) {
	if _, ok := r.entries.LoadAndDelete(k); ok {
		r.nEntries.Add(-1)
	}
}

// onInvalidations is rueidis's invalidation hook (it runs on the connection's reader: it only
// flips state). nil means every key: the connection broke or the server flushed.
func (r *RedisStore) onInvalidations(keys []rueidis.RedisMessage) {
	if keys == nil {
		r.epoch.Add(1)
		return
	}
	for _, m := range keys {
		key, err := m.ToString()
		if err != nil {
			continue
		}
		for _, k := range r.sessionKeysOf(key) {
			r.unvouch(k)
		}
	}
}

// unvouch stops the cache vouching for k's record (Redis invalidated it, or this handle has
// just written it), keeping the record for degraded mode. A fill in flight is not kept vouched.
func (r *RedisStore) unvouch(k hotKey) {
	e := r.cached(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gen++
	if c := e.cur.Load(); c != nil && c.epoch != 0 {
		e.cur.Store(&cachedRecord{rec: c.rec})
	}
}

// sessionKeysOf returns the sessions a Redis key may name: none unless it is a session
// record key (keySession), and two candidates when the service part may be a hex-encoded name
// (see tag): invalidating one session too many is harmless, one too few is not.
func (r *RedisStore) sessionKeysOf(key string) []hotKey {
	rest, ok := strings.CutPrefix(key, r.prefix)
	if !ok || !strings.HasPrefix(rest, "{") {
		return nil
	}
	svc, id, ok := strings.Cut(rest[1:], "}:s:")
	if !ok {
		return nil
	}
	out := []hotKey{{svc, id}}
	if h, ok := strings.CutPrefix(svc, "x"); ok {
		if b, err := hex.DecodeString(h); err == nil && strings.ContainsAny(string(b), "{}") {
			out = append(out, hotKey{string(b), id})
		}
	}
	return out
}

// touchOf returns this handle's pending touch of k (Unix ns, 0: none).
func (r *RedisStore) touchOf(k hotKey, e *cacheEntry) int64 {
	var t int64
	if e != nil {
		t = e.touch.Load()
	}
	if r.overflow.Load() {
		r.touchMu.Lock()
		t = max(t, r.touches[k])
		r.touchMu.Unlock()
	}
	return t
}

// pendingTouches takes every touch queued since the last call: the latest per session.
func (r *RedisStore) pendingTouches() map[hotKey]int64 {
	r.touchMu.Lock()
	dirty, pending := r.dirty, r.touches
	r.dirty, r.touches = nil, map[hotKey]int64{}
	r.overflow.Store(false)
	r.touchMu.Unlock()
	for _, e := range dirty {
		// Clear first: a Touch after this load queues the entry again.
		e.dirty.Store(false)
		if t := e.touch.Load(); t > pending[e.k] {
			pending[e.k] = t
		}
	}
	return pending
}

// requeueTouches puts touches a flush could not write back, for the next one.
func (r *RedisStore) requeueTouches(pending map[hotKey]int64) {
	r.touchMu.Lock()
	defer r.touchMu.Unlock()
	for k, t := range pending {
		if t > r.touches[k] {
			r.touches[k] = t
		}
	}
	if len(r.touches) > 0 {
		r.overflow.Store(true)
	}
}
