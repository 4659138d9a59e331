package memstore

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// The hot word of a session is the per-session state that changes on every request, kept
// outside memdb so that a request costs a few atomics instead of a write transaction. It packs
// liveness and the last request time in one atomic int64 so that "is it still alive?" and
// "when was it last seen?" change together:
//   - word >= 0: the session is alive and was last seen at time.Unix(0, word);
//   - word < 0: the session has been ended (or is being ended) by a writer; ^word is the last
//     seen time it was ended with. Touch never changes a dead word.
//
// Every version of an Active record shares one word (record.hot), so a touch is never lost
// when a writer replaces the version. Writers kill the word with a compare-and-swap against the
// value they based their decision on, so a Touch racing a reaper either lands before the kill
// (the reaper's CAS fails and it re-evaluates) or after it (the Touch is ignored): there is no
// window in which a touch is accepted and then silently lost by an expiry.

// touchWord moves the last-seen time in w forward to now (Unix nanoseconds) unless the session
// is dead, has lapsed by now (judged with r's limits), or was already seen later.
func (r *record) touch(now int64) {
	w := r.hot
	for {
		last := w.Load()
		if last < 0 || now <= last || now >= r.deadline(last) {
			return
		}
		if w.CompareAndSwap(last, now) {
			return
		}
	}
}

// lastSeen returns the last-seen time in Unix nanoseconds, dead or alive.
func (r *record) lastSeen() int64 {
	w := r.hot.Load()
	if w < 0 {
		return ^w
	}
	return w
}

// advance moves the last-seen time forward to at least n (writers only: Update may set it).
func (r *record) advance(n int64) {
	for {
		w := r.hot.Load()
		if w < 0 || n <= w || r.hot.CompareAndSwap(w, n) {
			return
		}
	}
}

// hotShards is the number of hot-table shards (a power of two): a shard that grows is copied
// by the writer, so each copy stays small.
const hotShards = 256

// hotTable maps (service, id) to the current version of every record memdb holds, Active or
// ended, so that Get and Touch read no memdb transaction, and writers (Create, Update, End,
// the reaper) find a record without a memdb lookup: under the writer lock it mirrors the id
// index exactly. It is an open-addressing hash table of
// record pointers (8 bytes a slot; the key is the record's own primary key), sharded, read
// without locks: readers load a shard's slot array and probe it with atomic loads. Writers —
// only ever one at a time, holding memdb's write transaction — store into the slots
// atomically, replace a removed record with the tombstone, and publish a new array when a
// shard fills past three quarters. A reader that probes an array being replaced sees a
// version that was current during its call (or misses and asks memdb, the store of record).
type hotTable struct {
	seed   maphash.Seed
	tomb   *record // marks a removed slot; never a real record
	shards [hotShards]hotShard
}

type hotShard struct {
	slots atomic.Pointer[hotSlots]
	live  int // records in slots; writer only
	used  int // live + tombstones; writer only
	_     [64 - 8 - 16]byte
}

type hotSlots struct{ s []atomic.Pointer[record] }

const hotMinSlots = 8

func newHotTable() *hotTable {
	t := &hotTable{seed: maphash.MakeSeed(), tomb: &record{}}
	for i := range t.shards {
		t.shards[i].slots.Store(&hotSlots{s: make([]atomic.Pointer[record], hotMinSlots)})
	}
	return t
}

// hash hashes the payload of an id part (see tagHex): a record's payload() or a lookup's.
func (t *hotTable) hash(payload string) uint64 { return maphash.String(t.seed, payload) }

// get returns the current record of (service, id) or nil. It takes no lock and does not
// allocate.
func (t *hotTable) get(service, id string) *record {
	k := makeIDKey(id)
	var h uint64
	if k.tag == tagHex {
		h = maphash.Bytes(t.seed, k.bin[:])
	} else {
		h = t.hash(id)
	}
	fp := fingerprint(h)
	s := t.shards[h&(hotShards-1)].slots.Load().s
	mask := uint64(len(s) - 1)
	for i := (h >> 8) & mask; ; i = (i + 1) & mask {
		r := s[i].Load()
		if r == nil {
			return nil
		}
		if r.fp == fp && r != t.tomb && r.hasKey(service, &k) {
			return r
		}
	}
}

// fingerprint is the part of a key's hash kept in its record (record.fp): a probe compares
// it before it reads the key's bytes, another cache line.
func fingerprint(h uint64) uint16 { return uint16(h >> 48) }

// current returns the current record of r's key or nil (r itself, if it still is; r need
// not be in the table).
func (t *hotTable) current(r *record) *record {
	h := t.hash(r.payload())
	fp := fingerprint(h)
	s := t.shards[h&(hotShards-1)].slots.Load().s
	mask := uint64(len(s) - 1)
	for i := (h >> 8) & mask; ; i = (i + 1) & mask {
		cur := s[i].Load()
		if cur == nil {
			return nil
		}
		if cur.fp == fp && cur != t.tomb && cur.pk == r.pk {
			return cur
		}
	}
}

// put stores r as the current record of its key, replacing any other version. Writers only.
func (t *hotTable) put(r *record) {
	h := t.hash(r.payload())
	r.fp = fingerprint(h)
	sh := &t.shards[h&(hotShards-1)]
	s := sh.slots.Load().s
	mask := uint64(len(s) - 1)
	free := -1
	for i := (h >> 8) & mask; ; i = (i + 1) & mask {
		cur := s[i].Load()
		switch {
		case cur == nil:
			if free < 0 {
				free = int(i)
				sh.used++
			}
			s[free].Store(r)
			sh.live++
			if sh.used*4 > len(s)*3 {
				t.grow(sh)
			}
			return
		case cur == t.tomb:
			if free < 0 {
				free = int(i)
			}
		case cur.fp == r.fp && cur.pk == r.pk:
			s[i].Store(r)
			return
		}
	}
}

// remove drops r if it is still the current record of its key (a late removal never drops a
// newer session that reused the id). Writers only.
func (t *hotTable) remove(r *record) {
	h := t.hash(r.payload())
	sh := &t.shards[h&(hotShards-1)]
	s := sh.slots.Load().s
	mask := uint64(len(s) - 1)
	for i := (h >> 8) & mask; ; i = (i + 1) & mask {
		switch s[i].Load() {
		case nil:
			return
		case r:
			s[i].Store(t.tomb)
			sh.live--
			return
		}
	}
}

// grow publishes a new slot array for sh holding its live records, with room to spare (or the
// same size, when tombstones filled it). Writers only.
func (t *hotTable) grow(sh *hotShard) {
	old := sh.slots.Load().s
	n := hotMinSlots
	for n*3 < sh.live*4+4 || n < sh.live*2 {
		n *= 2
	}
	s := make([]atomic.Pointer[record], n)
	mask := uint64(n - 1)
	for i := range old {
		r := old[i].Load()
		if r == nil || r == t.tomb {
			continue
		}
		j := (t.hash(r.payload()) >> 8) & mask
		for s[j].Load() != nil {
			j = (j + 1) & mask
		}
		s[j].Store(r)
	}
	sh.used = sh.live
	sh.slots.Store(&hotSlots{s: s})
}

// count returns how many records the table holds. Writers only (or a quiet store).
func (t *hotTable) count() int {
	n := 0
	for i := range t.shards {
		n += t.shards[i].live
	}
	return n
}

// nanos converts a Unix-nanosecond count to a UTC time.
func nanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// nanosOrZero is nanos, with 0 standing for the zero time (an unset Ended or LastModified).
func nanosOrZero(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return nanos(n)
}

// unixOrZero is the inverse of nanosOrZero.
func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
