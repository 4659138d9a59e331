package redisstore

import (
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// The replica cache is what one Store knows of the sessions it has read: per session, the
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
//
// This handle's own writes: Redis tracks a key for this handle from a read through the
// client-side cache until it sends the invalidation, and it sends one for this handle's own
// writes too, but possibly after the write's reply. Until it has come, rueidis's copy may be
// older than the write, and which invalidation is which cannot be told apart (one for an
// earlier write may arrive after a later write). So after every write of its own, a Get also
// reads the key uncached and serves that; it vouches for the cached copy (and stops checking)
// only once the two agree. Its own changes are visible to its next Get at once; the price is
// one uncached read after each of its writes (a new session, a touch flush, an end).

// hotKey identifies a session in a map (the touch and cache maps); it is
// comparable and built without allocation.
type hotKey struct{ service, id string }

// nanos converts a Unix-nanosecond count to a UTC time.
func nanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// cacheEntry is one session in a Store's cache. Its key strings are private copies.
type cacheEntry struct {
	k   hotKey
	mu  sync.Mutex // orders fills against invalidations and writes
	gen uint64     // guarded by mu: how many invalidations and own writes the key has had
	// awaiting is guarded by mu: the epoch in which this handle last wrote the key, until a
	// Get found the client-side cache's copy current again; 0: none.
	awaiting uint64
	gone     bool // guarded by mu: forgotten while awaiting; swept within two touch flushes
	cur      atomic.Pointer[cachedRecord]
	touch    atomic.Int64 // this handle's latest touch, Unix ns (0: none)
	dirty    atomic.Bool  // the touch is queued for the next flush (Store.dirty)
}

// cachedRecord is an immutable snapshot of what an entry knows.
type cachedRecord struct {
	rec   stored
	epoch uint64 // the cache epoch the record was vouched in; 0: not vouched (known only)
	until int64  // Unix ns after which it is read again even without an invalidation
}

// cached returns the entry of k, or nil. It takes no lock and does not allocate.
func (r *Store) cached(k hotKey) *cacheEntry {
	if v, ok := r.entries.Load(k); ok {
		return v.(*cacheEntry)
	}
	return nil
}

// entryFor returns the entry of k, making one unless the cache holds maxKnown entries (then
// nil: the caller goes without).
func (r *Store) entryFor(k hotKey) *cacheEntry {
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
func (r *Store) vouched(e *cacheEntry, now time.Time) (stored, bool) {
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

// beginFill notes that a read of e's key through the client-side cache is about to start and
// returns what to pass to fill. check reports that this handle wrote the key since a Get last
// found the cached copy current: the copy may be older than the write, so the caller compares
// it with an uncached read. A nil e (the cache is full) is read through the client-side cache
// only (such a session may be seen up to one invalidation late after this handle's writes).
func (r *Store) beginFill(e *cacheEntry) (gen, epoch uint64, check bool) {
	epoch = r.epoch.Load()
	if e == nil {
		return 0, epoch, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen, epoch, e.awaiting == epoch
}

// fill keeps rec, read after beginFill returned gen and epoch, as the entry's record: vouched
// for if vouch (it is the client-side cache's copy, and current) and nothing has invalidated or
// written the key since; a vouched record also ends the check for this handle's own write.
func (r *Store) fill(e *cacheEntry, rec stored, gen, epoch uint64, vouch bool, now time.Time) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := &cachedRecord{rec: rec}
	if e.gen == gen && vouch {
		c.epoch, c.until = epoch, now.Add(r.cacheTTL).UnixNano()
		e.awaiting = 0
	}
	e.cur.Store(c)
}

// remember keeps rec, just created by this handle, as the last known record of k, not vouched
// for, and checked at the next Get as after any write of its own.
func (r *Store) remember(k hotKey, rec stored) {
	if e := r.entryFor(k); e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.awaiting = r.epoch.Load()
		e.cur.Store(&cachedRecord{rec: rec})
	}
}

// forget drops what the cache knows of k (its pending touch, if any, is still flushed). An
// entry awaiting its own write's check stays, empty, for one to two touch flushes (sweepGone):
// long enough for the write's invalidation to have come, so a Get in between still checks.
func (r *Store) forget(k hotKey) {
	e := r.cached(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.awaiting != 0 && e.awaiting == r.epoch.Load() {
		if !e.gone {
			e.gone = true
			r.touchMu.Lock()
			r.goneNew = append(r.goneNew, e)
			r.touchMu.Unlock()
		}
		e.cur.Store(nil)
		return
	}
	r.drop(e)
}

// sweepGone drops the entries forgotten before the previous call (Run calls it at every touch
// flush, so a forgotten entry stays one to two flush intervals).
func (r *Store) sweepGone() {
	r.touchMu.Lock()
	old := r.goneOld
	r.goneOld, r.goneNew = r.goneNew, nil
	r.touchMu.Unlock()
	for _, e := range old {
		e.mu.Lock()
		if e.gone {
			r.drop(e)
		}
		e.mu.Unlock()
	}
}

// dropGone removes every forgotten entry (after a connection broke, no invalidation will).
func (r *Store) dropGone() {
	r.entries.Range(func(_, v any) bool {
		e := v.(*cacheEntry)
		e.mu.Lock()
		if e.gone {
			r.drop(e)
		}
		e.mu.Unlock()
		return true
	})
}

// drop removes e from the cache (e.mu held).
func (r *Store) drop(e *cacheEntry) {
	if r.entries.CompareAndDelete(e.k, e) {
		r.nEntries.Add(-1)
	}
}

// onInvalidations is rueidis's invalidation hook (it runs on the connection's reader: it only
// flips state). nil means every key: the connection broke or the server flushed.
func (r *Store) onInvalidations(keys []rueidis.RedisMessage) {
	if keys == nil {
		r.epoch.Add(1)
		go r.dropGone() // their invalidations will not come now
		return
	}
	for _, m := range keys {
		key, err := m.ToString()
		if err != nil {
			continue
		}
		for _, k := range r.sessionKeysOf(key) {
			r.invalidated(k)
		}
	}
}

// invalidated is Redis's word that k changed: its record is no longer vouched for (it is kept
// for degraded mode) and a fill in flight is not kept vouched.
func (r *Store) invalidated(k hotKey) {
	if e := r.cached(k); e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.gen++
		e.unvouchLocked()
	}
}

// wrote records that this handle has just written k (or tried to: a failed call may have been
// applied): as invalidated, and Gets check the cached copy against an uncached read until
// they agree (see beginFill).
func (r *Store) wrote(k hotKey) {
	if e := r.cached(k); e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.gen++
		e.awaiting = r.epoch.Load()
		e.unvouchLocked()
	}
}

func (e *cacheEntry) unvouchLocked() {
	if c := e.cur.Load(); c != nil && c.epoch != 0 {
		e.cur.Store(&cachedRecord{rec: c.rec})
	}
}

// sessionKeysOf returns the sessions a Redis key may name: none unless it is a session
// record key (keySession), and two candidates when the service part may be a hex-encoded name
// (see tag): invalidating one session too many is harmless, one too few is not.
func (r *Store) sessionKeysOf(key string) []hotKey {
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
func (r *Store) touchOf(k hotKey, e *cacheEntry) int64 {
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
func (r *Store) pendingTouches() map[hotKey]int64 {
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

// requeueTouches puts touches a flush could not write back, for the next one: into their
// entries where the cache has them (so Get stays lock-free while Redis is away), else into the
// overflow map.
func (r *Store) requeueTouches(pending map[hotKey]int64) {
	for k, t := range pending {
		if e := r.cached(k); e != nil {
			r.touchEntry(e, t)
			delete(pending, k)
		}
	}
	if len(pending) == 0 {
		return
	}
	r.touchMu.Lock()
	defer r.touchMu.Unlock()
	for k, t := range pending {
		if t > r.touches[k] {
			r.touches[k] = t
		}
	}
	r.overflow.Store(true)
}

// touchEntry moves e's pending touch forward to n (Unix ns) and queues e for the next flush.
func (r *Store) touchEntry(e *cacheEntry, n int64) {
	for {
		t := e.touch.Load()
		if n <= t || e.touch.CompareAndSwap(t, n) {
			break
		}
	}
	// Set the mark after the touch: a flush clears it before it reads the touch, so either
	// the flush sees this touch or the mark queues the entry again.
	if !e.dirty.Load() && e.dirty.CompareAndSwap(false, true) {
		r.touchMu.Lock()
		r.dirty = append(r.dirty, e)
		r.touchMu.Unlock()
	}
}
