package session

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// hotEntry is the per-session state that changes on every request, kept outside memdb so that
// a request costs a few atomics instead of a write transaction.
//
// word packs liveness and the last request time in one atomic word so that "is it still
// alive?" and "when was it last seen?" change together:
//   - word >= 0: the session is alive and was last seen at time.Unix(0, word);
//   - word < 0: the session has been ended (or is being ended) by a writer; ^word is the last
//     seen time it was ended with. Touch never changes a dead word.
//
// Writers kill the word with a compare-and-swap against the value they based their decision
// on, so a Touch racing a reaper either lands before the kill (the reaper's CAS fails and it
// re-evaluates) or after it (the Touch is ignored): there is no window in which a touch is
// accepted and then silently lost by an expiry.
//
// hard and idle mirror the record's Created+TTL and IdleTimeout so Touch can refuse to revive a
// lapsed session without reading memdb; writers update them when an Update changes the limits.
//
// rec is the record version currently stored in memdb (writers replace it, inside their write
// transaction, whenever they insert a new version of an Active record), so Get can answer for
// a live session from the hot map alone, without a memdb read transaction.
type hotEntry struct {
	word atomic.Int64 // see above
	hard atomic.Int64 // Created+TTL, Unix nanoseconds
	idle atomic.Int64 // IdleTimeout in nanoseconds; 0 = no idle timeout
	rec  atomic.Pointer[record]
}

func newHotEntry(s Session) *hotEntry {
	e := &hotEntry{}
	e.word.Store(s.LastSeen.UnixNano())
	e.setLimits(s)
	return e
}

// setLimits copies the session's TTL and idle limits.
func (e *hotEntry) setLimits(s Session) {
	e.hard.Store(s.Created.Add(s.TTL).UnixNano())
	e.idle.Store(int64(s.IdleTimeout))
}

// deadline returns when a session last seen at last lapses, in Unix nanoseconds.
func (e *hotEntry) deadline(last int64) int64 {
	d := e.hard.Load()
	if idle := e.idle.Load(); idle > 0 && last+idle < d {
		d = last + idle
	}
	return d
}

// touch moves the last-seen time forward to now (Unix nanoseconds) unless the session is dead,
// has lapsed by now, or was already seen later.
func (e *hotEntry) touch(now int64) {
	for {
		w := e.word.Load()
		if w < 0 || now <= w || now >= e.deadline(w) {
			return
		}
		if e.word.CompareAndSwap(w, now) {
			return
		}
	}
}

// lastSeen returns the last-seen time in Unix nanoseconds, dead or alive.
func (e *hotEntry) lastSeen() int64 {
	w := e.word.Load()
	if w < 0 {
		return ^w
	}
	return w
}

// advance moves the last-seen time forward to at least n (writers only: Update may set it).
func (e *hotEntry) advance(n int64) {
	for {
		w := e.word.Load()
		if w < 0 || n <= w || e.word.CompareAndSwap(w, n) {
			return
		}
	}
}

// hotKey identifies a session in the hot map; it is comparable and built without allocation.
type hotKey struct{ service, id string }

// hotShards is the number of hot-map shards (a power of two): enough that 1000 goroutines
// touching sessions rarely meet on one RWMutex.
const hotShards = 256

type hotShard struct {
	mu sync.RWMutex
	m  map[hotKey]*hotEntry
	_  [64 - 24 - 8]byte // keep shards on separate cache lines
}

// hotMap maps every Active session to its hotEntry. Writers add and remove entries while they
// hold memdb's write lock, so the map and the table change in the same order; Touch only reads.
type hotMap struct {
	seed   maphash.Seed
	shards [hotShards]hotShard
}

func newHotMap() *hotMap {
	h := &hotMap{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].m = make(map[hotKey]*hotEntry)
	}
	return h
}

func (h *hotMap) shard(id string) *hotShard {
	return &h.shards[maphash.String(h.seed, id)&(hotShards-1)]
}

// get returns the entry of (service, id) or nil. It does not allocate.
func (h *hotMap) get(service, id string) *hotEntry {
	sh := h.shard(id)
	sh.mu.RLock()
	e := sh.m[hotKey{service, id}]
	sh.mu.RUnlock()
	return e
}

func (h *hotMap) put(service, id string, e *hotEntry) {
	sh := h.shard(id)
	sh.mu.Lock()
	sh.m[hotKey{service, id}] = e
	sh.mu.Unlock()
}

// remove deletes (service, id) if it still maps to e, so a late removal can never drop the
// entry of a newer session that reused the id.
func (h *hotMap) remove(service, id string, e *hotEntry) {
	sh := h.shard(id)
	sh.mu.Lock()
	if sh.m[hotKey{service, id}] == e {
		delete(sh.m, hotKey{service, id})
	}
	sh.mu.Unlock()
}

// nanos converts a Unix-nanosecond count to a UTC time.
func nanos(n int64) time.Time { return time.Unix(0, n).UTC() }
