// Package memstore is the session.Store of one process, on hashicorp/go-memdb: lock-free
// reads and touches, a reaper for expiry, and snapshot/restore to a file.
package memstore

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hashicorp/go-memdb"

	"github.com/tether-dev/tether/pkg/session"
)

// DefaultSnapshotInterval is how often Run saves a snapshot (see WithSnapshot).
const DefaultSnapshotInterval = 30 * time.Second

var _ session.Store = (*Store)(nil)

// Store is the in-memory session.Store on hashicorp/go-memdb. Reads never block (MVCC);
// writes are serialised by memdb's single writer and cost a few microseconds, so they happen
// only when a session is created, updated or ends, never per request: Touch keeps the idle
// timer in a per-session atomic outside the table (see hot.go and Reap).
//
// memdb is the store of record (List, snapshots, every ended record), with one index over
// buckets of records (see bucket): a live session costs about 175 bytes of heap (1M sessions
// with generated ids, through the engine: the 80-byte record, its 24-byte key, ~18 of expiry
// item, ~17 of hot-table slots, ~11 of bucket and ~25 of radix nodes; see tagHex for the key
// form). A record with a raw id is a memdb object of its own (~340 bytes more of radix leaf).
// Every record is also reachable through a lock-free hot table, which serves Get and Touch
// without a memdb transaction and lets writers find a record without a memdb lookup; expiry
// is a heap outside memdb; instances and limits are interned, and instances counted.
//
// A Store is safe for concurrent use. Run drives the reaper and periodic snapshots.
type Store struct {
	db  *memdb.MemDB
	hot *hotTable

	// Writer state, changed only inside memdb write transactions (memdb has one writer at a
	// time): the expiry heap, and the interned names. groups and kinds are also read by
	// readers, under namesMu.
	expiry  expiryHeap
	txnGen  uint64       // the current write transaction's generation (see bucket)
	records atomic.Int64 // records in memdb (written by the writer only)
	nextDue atomic.Int64 // the heap's earliest item, for the reaper's lock-free look
	namesMu sync.Mutex
	groups  map[instKey]*instGroup
	kinds   atomic.Pointer[[]session.Kind]

	clock        func() time.Time
	log          *slog.Logger
	retention    time.Duration
	reapInterval time.Duration
	onEnd        atomic.Pointer[func(session.EndEvent)]
	snapPath     string
	snapInterval time.Duration

	snapMu sync.Mutex // one SaveSnapshot at a time (they share path.tmp)

	annMu   sync.Mutex // guards annQ and annBusy (see announce)
	annQ    []session.Session
	annBusy bool
	running atomic.Bool
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock the store reads "now" from (default time.Now). Only Touch and End
// take their time from the caller.
func WithClock(now func() time.Time) Option {
	return func(m *Store) {
		if now != nil {
			m.clock = now
		}
	}
}

// WithLogger sets the logger (default: discard). The store logs nothing on the request path.
func WithLogger(l *slog.Logger) Option {
	return func(m *Store) {
		if l != nil {
			m.log = l
		}
	}
}

// WithRetention sets how long ended (Expired or Terminated) records stay readable, so that a
// service with disableSessionIdReuse can refuse an expired id and List can show ended sessions.
// d <= 0 means DefaultRetention.
func WithRetention(d time.Duration) Option {
	return func(m *Store) {
		if d > 0 {
			m.retention = d
		}
	}
}

// WithReapInterval sets how often Run ends lapsed sessions and purges old records.
// d <= 0 means DefaultReapInterval.
func WithReapInterval(d time.Duration) Option {
	return func(m *Store) {
		if d > 0 {
			m.reapInterval = d
		}
	}
}

// WithOnEnd sets a callback invoked exactly once for every session that leaves Active through
// this store: End, the reaper, or a Create replacing a lapsed session. It is not invoked for
// sessions that RestoreSnapshot finds lapsed (see RestoreSnapshot). fn receives the ended
// session after the change is committed, outside every store lock, in commit order (two ends
// of one id never arrive swapped); it runs on the goroutine that made the change, or, while
// another goroutine is delivering ends, on that one. It may call the store, but it should
// return quickly. It is
// SetEndHandler at construction (a Store is its only handle, so every end is Local).
func WithOnEnd(fn func(session.Session)) Option {
	return func(m *Store) {
		if fn == nil {
			m.SetEndHandler(nil)
			return
		}
		m.SetEndHandler(func(ev session.EndEvent) { fn(ev.Session) })
	}
}

// SetEndHandler implements session.Store. A Store has one handle, so every event is Local.
func (m *Store) SetEndHandler(fn func(session.EndEvent)) {
	if fn == nil {
		m.onEnd.Store(nil)
		return
	}
	m.onEnd.Store(&fn)
}

// TouchDelay implements session.Store: a Store applies touches at once.
func (m *Store) TouchDelay() time.Duration { return 0 }

// WithSnapshot makes Run save a snapshot to path every interval and once more when its ctx
// ends. An empty path disables snapshots; interval <= 0 means DefaultSnapshotInterval.
func WithSnapshot(path string, interval time.Duration) Option {
	return func(m *Store) {
		m.snapPath = path
		if interval > 0 {
			m.snapInterval = interval
		}
	}
}

// NewMemStore returns an empty store.
func New(opts ...Option) *Store {
	m := &Store{
		hot:          newHotTable(),
		groups:       map[instKey]*instGroup{},
		clock:        time.Now,
		log:          slog.New(slog.DiscardHandler),
		retention:    session.DefaultRetention,
		reapInterval: session.DefaultReapInterval,
		snapInterval: DefaultSnapshotInterval,
	}
	for _, o := range opts {
		o(m)
	}
	db, err := memdb.NewMemDB(newSchema())
	if err != nil {
		// The schema is a constant of this package: failing here is a programming error.
		panic(fmt.Sprintf("session: invalid memdb schema: %v", err))
	}
	m.db = db
	kinds := []session.Kind{"", session.KindCookie, session.KindHeader, session.KindMCPStreamable, session.KindMCPSSE, session.KindMCPHandle, session.KindSticky}
	m.kinds.Store(&kinds)
	m.nextDue.Store(math.MaxInt64)
	return m
}

// instKey names an instance of a service.
type instKey struct{ service, instance string }

// instGroup is an interned instance: the one copy of its name that every record bound to it
// shares, and the count of its stored-Active records by kind code (what ActiveByInstance
// would list), kept by the writer so that counting an instance's sessions needs no scan.
// refs counts the records in memdb that point at it; the group is forgotten when none does.
type instGroup struct {
	name   string
	refs   int                 // guarded by Store.namesMu
	active []int               // by kind code; guarded by Store.namesMu
	binds  map[limits]*binding // guarded by Store.namesMu
}

// limits are a binding's TTL and idle timeout.
type limits struct{ ttl, idle time.Duration }

// binding is what a record shares with the other records of its instance and limits: the
// interned instance, the TTL and the idle timeout (a service's sessions nearly all have the
// same), so that a record is 80 bytes, not 96. Its fields are immutable but refs, which counts
// the records in memdb that point at it; it is forgotten when none does.
type binding struct {
	inst *instGroup
	ttl  time.Duration
	idle time.Duration
	refs int // guarded by Store.namesMu
}

// bind returns the interned binding of (service, instance, ttl, idle), creating it. Writers
// only.
func (m *Store) bind(service, instance string, ttl, idle time.Duration) *binding {
	m.namesMu.Lock()
	defer m.namesMu.Unlock()
	k := instKey{service, instance}
	g := m.groups[k]
	if g == nil {
		k = instKey{strings.Clone(service), strings.Clone(instance)}
		g = &instGroup{name: k.instance, binds: map[limits]*binding{}}
		m.groups[k] = g
	}
	l := limits{ttl, idle}
	b := g.binds[l]
	if b == nil {
		b = &binding{inst: g, ttl: ttl, idle: idle}
		g.binds[l] = b
	}
	return b
}

// kindCode interns a kind. A store holds at most 256 distinct kinds (tether has six);
// checkKind refuses more before anything is written.
func (m *Store) kindCode(k session.Kind) uint8 {
	m.namesMu.Lock()
	defer m.namesMu.Unlock()
	kinds := *m.kinds.Load()
	for i, have := range kinds {
		if have == k {
			return uint8(i)
		}
	}
	grown := append(slices.Clip(kinds), session.Kind(strings.Clone(string(k))))
	m.kinds.Store(&grown)
	return uint8(len(grown) - 1)
}

// checkKind refuses a kind that would not fit the store's table of kinds.
func (m *Store) checkKind(k session.Kind) error {
	kinds := *m.kinds.Load()
	if len(kinds) < 256 || slices.Contains(kinds, k) {
		return nil
	}
	return fmt.Errorf("%w: more than 256 distinct session kinds", session.ErrInvalid)
}

func (m *Store) kindName(c uint8) session.Kind { return (*m.kinds.Load())[c] }

// account keeps the writer state in step with one memdb change: record old (nil for an
// insert) replaced by next (nil for a delete). It moves the instance counts and references,
// the hot table entry and schedules next on the expiry heap. It runs inside the write
// transaction, after memdb accepted the change.
func (m *Store) account(txn *memdb.Txn, old, next *record) {
	m.namesMu.Lock()
	if old != nil {
		m.unrefLocked(old, next)
	}
	if next != nil {
		refLocked(next)
	}
	m.namesMu.Unlock()
	switch {
	case next != nil:
		m.hot.put(next)
	case old != nil:
		m.hot.remove(old)
	}
	switch {
	case old == nil:
		m.records.Add(1)
	case next == nil:
		m.records.Add(-1)
	}
	if next != nil {
		m.schedule(next)
		if len(m.expiry) > 2*int(m.records.Load())+1024 {
			// Unreachable errors only (this package's indexers): the schedule then keeps its
			// stale items, which the reaper drops as they come due.
			m.compactExpiry()
		}
	}
}

// unrefLocked drops old's references to its binding and instance (and its active count),
// forgetting a binding or instance that nothing refers to any more unless next (nil for a
// delete) takes it over. m.namesMu must be held.
func (m *Store) unrefLocked(old, next *record) {
	ob, og := old.bound, old.bound.inst
	ob.refs--
	og.refs--
	if old.active() {
		og.active[old.kind]--
	}
	if ob.refs == 0 && (next == nil || next.bound != ob) {
		delete(og.binds, limits{ob.ttl, ob.idle})
	}
	if og.refs == 0 && (next == nil || next.bound.inst != og) {
		delete(m.groups, instKey{old.service(), og.name})
	}
}

// refLocked adds next's references to its binding and instance (and its active count).
// m.namesMu must be held.
func refLocked(next *record) {
	nb, ng := next.bound, next.bound.inst
	nb.refs++
	ng.refs++
	if next.active() {
		if int(next.kind) >= len(ng.active) {
			ng.active = append(ng.active, make([]int, int(next.kind)+1-len(ng.active))...)
		}
		ng.active[next.kind]++
	}
}

// now reads the clock as a UTC wall-clock time (all stored times are UTC without monotonic
// readings, so snapshots and comparisons agree).
func (m *Store) now() time.Time { return m.clock().UTC() }

// record is a stored session, in a compact form: a live session costs a slot in a memdb bucket
// (or a memdb object of its own, for a raw id; see bucket), this record (80 bytes), its key
// bytes, a hot-table slot and an expiry-heap item. Records are
// immutable once inserted except for the atomic hot word: writers insert a new version.
//
//   - pk is the id index key, service\x00 then the id part (see tagHex: a generated id is
//     kept in 18 bytes); memdb's leaf shares its bytes, and Service is a substring of it.
//     ID is rebuilt from it when a record is read out, except on Get, which hands back the
//     caller's id.
//   - bound is the interned instance, TTL and idle timeout (see binding): one name string per
//     instance, not per session.
//   - times are Unix nanoseconds (0: the zero time), kind and status small codes.
//   - hot points at the session's hot word (see hot.go), which holds LastSeen: every version of
//     an Active record shares the word of its first version (word, embedded); an ended record
//     has a dead word of its own holding its final LastSeen.
type record struct {
	pk       string
	bound    *binding
	created  int64
	modified int64
	ended    int64
	attrs    map[string]string
	hot      *atomic.Int64
	svcLen   uint16
	fp       uint16 // hot-table fingerprint of the key, set by hotTable.put before it publishes the record
	kind     uint8
	status   uint8
	reuse    bool
	word     atomic.Int64
}

// Status codes of a record.
const (
	codeActive uint8 = iota
	codeExpired
	codeTerminated
)

func statusCode(s session.Status) uint8 {
	switch s {
	case session.StatusExpired:
		return codeExpired
	case session.StatusTerminated:
		return codeTerminated
	}
	return codeActive
}

func statusOf(c uint8) session.Status {
	switch c {
	case codeExpired:
		return session.StatusExpired
	case codeTerminated:
		return session.StatusTerminated
	}
	return session.StatusActive
}

func (r *record) service() string { return r.pk[:r.svcLen] }
func (r *record) active() bool    { return r.status == codeActive }

// idPart returns the id part of the key: its tag and payload.
func (r *record) idPart() string { return r.pk[int(r.svcLen)+1:] }

// payload returns the id part without its tag (what the hot table hashes).
func (r *record) payload() string { return r.pk[int(r.svcLen)+2:] }

// id returns the session id (built anew for a generated id).
func (r *record) id() string { return idOfKey(r.idPart()) }

// hasKey reports whether the record's key is (service, k), without building the key.
func (r *record) hasKey(service string, k *idKey) bool {
	n := len(service)
	if int(r.svcLen) != n || len(r.pk) < n+2 || r.pk[:n] != service || r.pk[n+1] != k.tag {
		return false
	}
	if k.tag == tagHex {
		return r.pk[n+2:] == string(k.bin[:])
	}
	return r.pk[n+2:] == k.raw
}

// makePK builds the primary key of (service, k) as a string of its own.
func makePK(service string, k *idKey) string {
	payload := k.raw
	if k.tag == tagHex {
		payload = string(k.bin[:])
	}
	b := make([]byte, 0, len(service)+2+len(payload))
	b = append(append(append(b, service...), 0, k.tag), payload...)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// deadline returns when the session lapses if it was last seen at last, in Unix nanoseconds.
func (r *record) deadline(last int64) int64 {
	d := addNanos(r.created, r.bound.ttl)
	if idle := r.bound.idle; idle > 0 {
		d = min(d, addNanos(last, idle))
	}
	return d
}

// addNanos returns t+d, saturating at the largest time instead of overflowing.
func addNanos(t int64, d time.Duration) int64 {
	if s := t + int64(d); s >= t {
		return s
	}
	return math.MaxInt64
}

// newRecord builds the record of s, with pk reused from prev when prev has the same key (all
// versions of a session share their key bytes). hot is the shared word of an Active version
// (nil: the record gets a word of its own, alive with s.LastSeen for an Active session, dead
// for an ended one). Writers only: it interns names into the store's tables.
func (m *Store) newRecord(s session.Session, prev *record, hot *atomic.Int64) *record {
	r := &record{
		bound:    m.bind(s.Service, s.Instance, s.TTL, s.IdleTimeout),
		created:  s.Created.UnixNano(),
		modified: unixOrZero(s.LastModified),
		ended:    unixOrZero(s.Ended),
		attrs:    s.Attributes,
		svcLen:   uint16(len(s.Service)),
		kind:     m.kindCode(s.Kind),
		status:   statusCode(s.Status),
		reuse:    s.DisableReuse,
	}
	k := makeIDKey(s.ID)
	if prev != nil && prev.hasKey(s.Service, &k) {
		r.pk = prev.pk
	} else {
		r.pk = makePK(s.Service, &k)
	}
	switch {
	case hot != nil:
		r.hot = hot
	case r.active():
		r.word.Store(s.LastSeen.UnixNano())
		r.hot = &r.word
	default:
		r.word.Store(^s.LastSeen.UnixNano())
		r.hot = &r.word
	}
	return r
}

// stored returns the record as a Session: LastSeen includes touches, statuses as stored.
// Attributes is shared with the record: clone before handing it out.
func (m *Store) stored(r *record) session.Session { return m.storedAs(r, r.service(), r.id()) }

// storedAs is stored with the record's service and id given (equal strings the caller holds,
// so that no id is built).
func (m *Store) storedAs(r *record, service, id string) session.Session {
	return session.Session{
		ID:           id,
		Service:      service,
		Instance:     r.bound.inst.name,
		Kind:         m.kindName(r.kind),
		Created:      nanos(r.created),
		LastModified: nanosOrZero(r.modified),
		LastSeen:     nanos(r.lastSeen()),
		TTL:          r.bound.ttl,
		IdleTimeout:  r.bound.idle,
		Status:       statusOf(r.status),
		DisableReuse: r.reuse,
		Ended:        nanosOrZero(r.ended),
		Attributes:   r.attrs,
	}
}

// reapAt is when the reaper must next look at the record, in Unix nanoseconds: an Active
// record's ExpiresAt by its current LastSeen, an ended record's Ended+retention.
func (m *Store) reapAt(r *record) int64 {
	if r.active() {
		return r.deadline(r.lastSeen())
	}
	return r.ended + int64(m.retention)
}

// view returns the session as Get reports it at now: touches merged, a lapsed Active session
// shown as Expired at its ExpiresAt, a private Attributes map.
func (m *Store) view(r *record, now time.Time) session.Session { return m.viewOf(m.stored(r), now) }

// viewOf is view of a stored session.
func (m *Store) viewOf(s session.Session, now time.Time) session.Session {
	if s.Status == session.StatusActive && !now.Before(s.ExpiresAt()) {
		s.Status = session.StatusExpired
		s.Ended = s.ExpiresAt()
	}
	s.Attributes = session.CloneAttributes(s.Attributes)
	return s
}

// kill marks the hot word dead (no touch lands after this) and returns the session with its
// final LastSeen. Writers call it inside their write transaction.
func (m *Store) kill(r *record) session.Session {
	for {
		w := r.hot.Load()
		if w < 0 || r.hot.CompareAndSwap(w, ^w) {
			return m.stored(r)
		}
	}
}

// killIfLapsed kills the hot word only if the session has lapsed at now, judged on the very
// last-seen value it kills: a Touch that lands first keeps the session alive. It reports
// whether it was killed; stored(r) then holds the final LastSeen.
func killIfLapsed(r *record, now time.Time) bool {
	for {
		w := r.hot.Load()
		last := w
		if w < 0 {
			last = ^w
		}
		if now.UnixNano() < r.deadline(last) {
			return false
		}
		if w < 0 || r.hot.CompareAndSwap(w, ^w) {
			return true
		}
	}
}

// retained reports whether the viewed record is still visible at now.
func (m *Store) retained(v session.Session, now time.Time) bool {
	return v.Status == session.StatusActive || now.Before(v.Ended.Add(m.retention))
}

// insert stores next in place of old (nil: none) and keeps the writer state in step.
func (m *Store) insert(txn *memdb.Txn, old, next *record) error {
	if err := m.put(txn, next); err != nil {
		return err
	}
	m.account(txn, old, next)
	return nil
}

// endTxn stores s, the final state of old (whose hot word the caller has killed), as an ended
// record. It returns s with a private Attributes map.
func (m *Store) endTxn(txn *memdb.Txn, old *record, s session.Session) (session.Session, error) {
	if err := m.insert(txn, old, m.newRecord(s, old, nil)); err != nil {
		return session.Session{}, err
	}
	s.Attributes = session.CloneAttributes(s.Attributes)
	return s, nil
}

// commit commits txn and announces the sessions it ended (see announce).
func (m *Store) commit(txn *memdb.Txn, ended []session.Session) {
	if len(ended) > 0 {
		// Queued before the commit releases the writer lock, so the queue is in commit order.
		m.annMu.Lock()
		m.annQ = append(m.annQ, ended...)
		m.annMu.Unlock()
	}
	txn.Commit()
	if len(ended) > 0 {
		m.announce()
	}
}

// announce calls the end handler for the queued ends, in the order their transactions
// committed, outside every store lock. One goroutine delivers at a time: a writer that finds
// another delivering leaves its ends to it (that one keeps going until the queue is empty), so
// two ends of one session are never announced out of order, and a handler that calls the
// store (its End queues another end) does not deadlock: its end is delivered after it returns.
// Uncontended, the ends are delivered on the goroutine that made them, before its call returns.
func (m *Store) announce() {
	for {
		m.annMu.Lock()
		if m.annBusy || len(m.annQ) == 0 {
			m.annMu.Unlock()
			return
		}
		m.annBusy = true
		batch := m.annQ
		m.annQ = nil
		m.annMu.Unlock()
		fn := m.onEnd.Load()
		for _, s := range batch {
			if fn != nil {
				s.Attributes = session.CloneAttributes(s.Attributes) // the callback owns its copy
				(*fn)(session.EndEvent{Session: s, Local: true})
			}
		}
		m.annMu.Lock()
		m.annBusy = false
		m.annMu.Unlock()
	}
}

// Create implements session.Store.
func (m *Store) Create(ctx context.Context, s session.Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := m.now()
	s, err := session.PrepareCreate(s, now)
	if err != nil {
		return err
	}
	if err := m.checkKind(s.Kind); err != nil {
		return fmt.Errorf("create session %q: %w", s.ID, err)
	}

	txn := m.writeTxn()
	defer txn.Abort()
	// Built under the writer lock: a binding handed out before it could be forgotten (its last
	// record purged) by the writer of the moment, and this record would then count for an
	// instance CountActiveByInstance no longer finds.
	r := m.newRecord(s, nil, nil)
	var ended []session.Session
	old := m.hot.current(r) // exact under the writer lock: the hot table mirrors the id index
	if old != nil && old.reuse && (!old.active() || !m.view(old, now).ActiveAt(now)) {
		// Judged inside the write transaction: no End, Update or Create can change the
		// record between this check and the insert below.
		if m.retained(m.view(old, now), now) {
			return fmt.Errorf("create session %q: %w", s.ID, session.ErrReuseDisabled)
		}
	}
	if old != nil && old.active() {
		if !killIfLapsed(old, now) {
			return fmt.Errorf("create session %q: %w", s.ID, session.ErrExists)
		}
		// The old session lapsed but the reaper has not ended it yet: end it here, so its
		// slot is announced free exactly once, and let the new record replace it.
		prev := m.storedAs(old, s.Service, s.ID)
		prev.Status, prev.Ended = session.StatusExpired, prev.ExpiresAt()
		prev.Attributes = session.CloneAttributes(prev.Attributes)
		ended = append(ended, prev)
	}
	if err := m.insert(txn, old, r); err != nil {
		return fmt.Errorf("create session %q: %w", s.ID, err)
	}
	m.commit(txn, ended)
	return nil
}

// Get implements session.Store. A stored session is answered from the hot table: no memdb read
// transaction, no allocation (unless it has attributes). An id the hot table misses is read
// from memdb, the store of record (a lookup racing a shard's growth may miss).
func (m *Store) Get(ctx context.Context, service, id string) (session.Session, error) {
	if err := ctx.Err(); err != nil {
		return session.Session{}, err
	}
	if r := m.hot.get(service, id); r != nil {
		now := m.now()
		// The caller's strings: equal, no id to build and no pointer into the table.
		if v := m.viewOf(m.storedAs(r, service, id), now); m.retained(v, now) {
			return v, nil
		}
		return session.Session{}, fmt.Errorf("get session %q: %w", id, session.ErrNotFound)
	}
	r, err := first(m.db.Txn(false), service, id)
	if err != nil {
		return session.Session{}, fmt.Errorf("get session %q: %w", id, err)
	}
	if r == nil {
		return session.Session{}, fmt.Errorf("get session %q: %w", id, session.ErrNotFound)
	}
	now := m.now()
	v := m.viewOf(m.storedAs(r, service, id), now)
	if !m.retained(v, now) {
		return session.Session{}, fmt.Errorf("get session %q: %w", id, session.ErrNotFound)
	}
	return v, nil
}

// Touch implements session.Store. It costs a lock-free hot-table probe and a compare-and-swap, and is
// visible at once (TouchDelay 0).
func (m *Store) Touch(_ context.Context, service, id string, now time.Time) {
	if r := m.hot.get(service, id); r != nil {
		r.touch(now.UnixNano())
	}
}

// Update implements session.Store. fn runs inside the store's write transaction: it must be quick.
func (m *Store) Update(ctx context.Context, service, id string, fn func(*session.Session) error) (session.Session, error) {
	if err := ctx.Err(); err != nil {
		return session.Session{}, err
	}
	now := m.now()
	txn := m.writeTxn()
	defer txn.Abort()
	old := m.hot.get(service, id) // exact under the writer lock: the hot table mirrors the id index
	if old == nil {
		return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrNotFound)
	}
	v := m.view(old, now)
	switch {
	case !m.retained(v, now):
		return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrNotFound)
	case !old.active():
		return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrEnded)
	case v.Status != session.StatusActive:
		return session.Session{}, fmt.Errorf("update session %q: %w", id, session.ErrExpired)
	}
	stored := m.stored(old)
	if err := fn(&v); err != nil {
		return session.Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	v, err := session.PrepareUpdate(id, stored, v, now)
	if err != nil {
		return session.Session{}, err
	}
	if err := m.checkKind(v.Kind); err != nil {
		return session.Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	r := m.newRecord(v, old, old.hot)
	r.advance(v.LastSeen.UnixNano())
	if err := m.insert(txn, old, r); err != nil {
		return session.Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	txn.Commit()
	return m.view(r, now), nil
}

// End implements session.Store.
func (m *Store) End(ctx context.Context, service, id string, status session.Status, now time.Time) (session.Session, error) {
	if err := ctx.Err(); err != nil {
		return session.Session{}, err
	}
	if status != session.StatusExpired && status != session.StatusTerminated {
		return session.Session{}, fmt.Errorf("end session %q: %w: status %q", id, session.ErrInvalid, status)
	}
	now = now.UTC()
	txn := m.writeTxn()
	defer txn.Abort()
	old := m.hot.get(service, id) // exact under the writer lock: the hot table mirrors the id index
	if old == nil || !m.retained(m.view(old, now), now) {
		return session.Session{}, fmt.Errorf("end session %q: %w", id, session.ErrNotFound)
	}
	if !old.active() {
		return session.Session{}, fmt.Errorf("end session %q: %w", id, session.ErrEnded)
	}
	s := m.kill(old)
	var lapsed bool
	if exp := s.ExpiresAt(); !now.Before(exp) {
		s.Status, s.Ended, lapsed = session.StatusExpired, exp, true
	} else {
		s.Status, s.Ended = status, now
	}
	s, err := m.endTxn(txn, old, s)
	if err != nil {
		return session.Session{}, fmt.Errorf("end session %q: %w", id, err)
	}
	m.commit(txn, []session.Session{s})
	if lapsed && status != session.StatusExpired {
		return session.Session{}, fmt.Errorf("end session %q: %w: %w", id, session.ErrEnded, session.ErrExpired)
	}
	return s, nil
}

// ActiveByInstance implements session.Store. It walks the service's records in one memdb snapshot
// (there is no instance index: it would cost every live session ~350 bytes, and this is called
// only when an instance is lost); CountActiveByInstance counts without a walk.
func (m *Store) ActiveByInstance(ctx context.Context, service, instance string) ([]session.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []session.Session
	n := 0
	var ctxErr error
	err := scan(m.db.Txn(false), service, session.PageCursor{}, func(r *record) bool {
		if n++; n%4096 == 0 {
			if ctxErr = ctx.Err(); ctxErr != nil {
				return false
			}
		}
		if r.active() && r.bound.inst.name == instance {
			s := m.storedAs(r, service, r.id())
			s.Attributes = session.CloneAttributes(s.Attributes)
			out = append(out, s)
		}
		return true
	})
	switch {
	case ctxErr != nil:
		return nil, ctxErr
	case err != nil:
		return nil, fmt.Errorf("sessions of %s/%s: %w", service, instance, err)
	}
	return out, nil
}

// Len returns how many records the store holds: Active sessions and ended ones not purged yet.
func (m *Store) Len() int { return int(m.records.Load()) }

var _ session.InstanceCounter = (*Store)(nil)

// CountActiveByInstance implements session.InstanceCounter.
func (m *Store) CountActiveByInstance(ctx context.Context, service, instance string) (map[session.Kind]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := map[session.Kind]int{}
	m.namesMu.Lock()
	defer m.namesMu.Unlock()
	if g := m.groups[instKey{service, instance}]; g != nil {
		for code, n := range g.active {
			if n > 0 {
				out[m.kindName(uint8(code))] = n
			}
		}
	}
	return out, nil
}
