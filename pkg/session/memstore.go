package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-memdb"
)

// Defaults of the MemStore options.
const (
	DefaultRetention        = 24 * time.Hour
	DefaultReapInterval     = time.Second
	DefaultSnapshotInterval = 30 * time.Second
)

// MaxNameLen bounds the length in bytes of a session id, service name and instance id.
const MaxNameLen = 1024

var _ Store = (*MemStore)(nil)

// MemStore is the in-memory Store on hashicorp/go-memdb. Reads never block (MVCC); writes are
// serialised by memdb's single writer and cost a few microseconds, so they happen only when a
// session is created, updated or ends, never per request: Touch keeps the idle timer in a
// per-session atomic outside the table (see hotEntry and Reap).
//
// A MemStore is safe for concurrent use. Run drives the reaper and periodic snapshots.
type MemStore struct {
	db  *memdb.MemDB
	hot *hotMap

	clock        func() time.Time
	log          *slog.Logger
	retention    time.Duration
	reapInterval time.Duration
	onEnd        atomic.Pointer[func(EndEvent)]
	snapPath     string
	snapInterval time.Duration

	snapMu  sync.Mutex // one SaveSnapshot at a time (they share path.tmp)
	running atomic.Bool
}

// Option configures a MemStore.
type Option func(*MemStore)

// WithClock sets the clock the store reads "now" from (default time.Now). Only Touch and End
// take their time from the caller.
func WithClock(now func() time.Time) Option {
	return func(m *MemStore) {
		if now != nil {
			m.clock = now
		}
	}
}

// WithLogger sets the logger (default: discard). The store logs nothing on the request path.
func WithLogger(l *slog.Logger) Option {
	return func(m *MemStore) {
		if l != nil {
			m.log = l
		}
	}
}

// WithRetention sets how long ended (Expired or Terminated) records stay readable, so that a
// service with disableSessionIdReuse can refuse an expired id and List can show ended sessions.
// d <= 0 means DefaultRetention.
func WithRetention(d time.Duration) Option {
	return func(m *MemStore) {
		if d > 0 {
			m.retention = d
		}
	}
}

// WithReapInterval sets how often Run ends lapsed sessions and purges old records.
// d <= 0 means DefaultReapInterval.
func WithReapInterval(d time.Duration) Option {
	return func(m *MemStore) {
		if d > 0 {
			m.reapInterval = d
		}
	}
}

// WithOnEnd sets a callback invoked exactly once for every session that leaves Active through
// this store: End, the reaper, or a Create replacing a lapsed session. It is not invoked for
// sessions that RestoreSnapshot finds lapsed (see RestoreSnapshot). fn receives the ended
// session; it runs on the goroutine that made the change, after the change is committed and
// outside every store lock, so it may call the store, but it should return quickly. It is
// SetEndHandler at construction (a MemStore is its only handle, so every end is Local).
func WithOnEnd(fn func(Session)) Option {
	return func(m *MemStore) {
		if fn == nil {
			m.SetEndHandler(nil)
			return
		}
		m.SetEndHandler(func(ev EndEvent) { fn(ev.Session) })
	}
}

// SetEndHandler implements Store. A MemStore has one handle, so every event is Local.
func (m *MemStore) SetEndHandler(fn func(EndEvent)) {
	if fn == nil {
		m.onEnd.Store(nil)
		return
	}
	m.onEnd.Store(&fn)
}

// TouchDelay implements Store: a MemStore applies touches at once.
func (m *MemStore) TouchDelay() time.Duration { return 0 }

// WithSnapshot makes Run save a snapshot to path every interval and once more when its ctx
// ends. An empty path disables snapshots; interval <= 0 means DefaultSnapshotInterval.
func WithSnapshot(path string, interval time.Duration) Option {
	return func(m *MemStore) {
		m.snapPath = path
		if interval > 0 {
			m.snapInterval = interval
		}
	}
}

// NewMemStore returns an empty store.
func NewMemStore(opts ...Option) *MemStore {
	m := &MemStore{
		hot:          newHotMap(),
		clock:        time.Now,
		log:          slog.New(slog.DiscardHandler),
		retention:    DefaultRetention,
		reapInterval: DefaultReapInterval,
		snapInterval: DefaultSnapshotInterval,
	}
	for _, o := range opts {
		o(m)
	}
	db, err := memdb.NewMemDB(newSchema(m.retention))
	if err != nil {
		// The schema is a constant of this package: failing here is a programming error.
		panic(fmt.Sprintf("session: invalid memdb schema: %v", err))
	}
	m.db = db
	return m
}

// now reads the clock as a UTC wall-clock time (all stored times are UTC without monotonic
// readings, so snapshots and comparisons agree).
func (m *MemStore) now() time.Time { return m.clock().UTC() }

// record is the memdb object. It is immutable once inserted: writers clone it.
type record struct {
	s Session
	// hot is the session's hot entry while it is stored Active, nil otherwise. Clones of an
	// Active record share it, so a reader of any version sees the latest touches.
	hot *hotEntry
}

// clone returns a copy that owns its Attributes map.
func (r *record) clone() *record {
	c := *r
	c.s.Attributes = cloneAttrs(r.s.Attributes)
	return &c
}

// merged returns the stored session with LastSeen including touches. Attributes is shared with
// the record: clone before handing it out.
func (r *record) merged() Session {
	s := r.s
	if r.hot != nil {
		if n := r.hot.lastSeen(); n > s.LastSeen.UnixNano() {
			s.LastSeen = nanos(n)
		}
	}
	return s
}

// reapAt is the expiry index value: when the reaper must next look at the record.
func (r *record) reapAt(retention time.Duration) time.Time {
	if r.s.Status == StatusActive {
		// Based on the stored LastSeen, which is never later than the hot one: the index can
		// only be early, never late (see Reap).
		return r.s.ExpiresAt()
	}
	return r.s.Ended.Add(retention)
}

// view returns the session as Get reports it at now: touches merged, a lapsed Active session
// shown as Expired at its ExpiresAt, a private Attributes map.
func (r *record) view(now time.Time) Session {
	s := r.merged()
	if s.Status == StatusActive && !now.Before(s.ExpiresAt()) {
		s.Status = StatusExpired
		s.Ended = s.ExpiresAt()
	}
	s.Attributes = cloneAttrs(s.Attributes)
	return s
}

// kill marks the hot entry dead (no touch lands after this) and returns the session with its
// final LastSeen. Writers call it inside their write transaction.
func (r *record) kill() Session {
	s := r.s
	for r.hot != nil {
		w := r.hot.word.Load()
		if w < 0 || r.hot.word.CompareAndSwap(w, ^w) {
			if last := r.hot.lastSeen(); last > s.LastSeen.UnixNano() {
				s.LastSeen = nanos(last)
			}
			break
		}
	}
	return s
}

// killIfLapsed kills the hot entry only if the session has lapsed at now, judged on the very
// last-seen value it kills: a Touch that lands first keeps the session alive. It returns the
// merged session and whether it was killed.
func (r *record) killIfLapsed(now time.Time) (Session, bool) {
	s := r.s
	stored := s.LastSeen
	for {
		var w int64
		if r.hot != nil {
			w = r.hot.word.Load()
			last := w
			if w < 0 {
				last = ^w
			}
			s.LastSeen = stored
			if last > stored.UnixNano() {
				s.LastSeen = nanos(last)
			}
		}
		if now.Before(s.ExpiresAt()) {
			return s, false
		}
		if r.hot == nil || w < 0 || r.hot.word.CompareAndSwap(w, ^w) {
			return s, true
		}
	}
}

func cloneAttrs(a map[string]string) map[string]string {
	if len(a) == 0 {
		return nil
	}
	return maps.Clone(a)
}

// checkName validates an id, service or instance name.
func checkName(field, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: empty %s", ErrInvalid, field)
	case len(v) > MaxNameLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalid, field, MaxNameLen)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: NUL byte in %s", ErrInvalid, field)
	}
	return nil
}

// checkSession validates the fields every stored session must satisfy.
func checkSession(s Session) error {
	for _, f := range []struct{ name, v string }{
		{"id", s.ID}, {"service", s.Service}, {"instance", s.Instance},
	} {
		if err := checkName(f.name, f.v); err != nil {
			return err
		}
	}
	switch {
	case s.TTL <= 0:
		return fmt.Errorf("%w: TTL %v is not positive", ErrInvalid, s.TTL)
	case s.IdleTimeout < 0:
		return fmt.Errorf("%w: negative idle timeout %v", ErrInvalid, s.IdleTimeout)
	case s.Created.UnixNano() <= 0 || s.Created.Year() >= 2262:
		// The hot word stores Unix nanoseconds and uses the sign bit as the "ended" flag.
		return fmt.Errorf("%w: created time %v out of range", ErrInvalid, s.Created)
	}
	return nil
}

// Bounds on a session's attributes, checked on Create and Update (not on snapshot restore,
// which keeps what an earlier release stored): a client that may write sessions cannot make
// one session cost more than about MaxAttributeBytes of memory, and every replica's copy of it.
const (
	// MaxAttributes is the most attributes one session may hold.
	MaxAttributes = 64
	// MaxAttributeBytes bounds the sum of the lengths of a session's attribute keys and values.
	MaxAttributeBytes = 16 << 10
)

// checkAttributes enforces MaxAttributes and MaxAttributeBytes; keys must not be empty.
func checkAttributes(attrs map[string]string) error {
	if len(attrs) > MaxAttributes {
		return fmt.Errorf("%w: %d attributes, at most %d", ErrInvalid, len(attrs), MaxAttributes)
	}
	n := 0
	for k, v := range attrs {
		if k == "" {
			return fmt.Errorf("%w: an attribute key is empty", ErrInvalid)
		}
		n += len(k) + len(v)
	}
	if n > MaxAttributeBytes {
		return fmt.Errorf("%w: attributes take %d bytes, at most %d", ErrInvalid, n, MaxAttributeBytes)
	}
	return nil
}

// prepareNew fills in and checks a session for Create at now (every Store's rules).
func prepareNew(s Session, now time.Time) (Session, error) {
	s.Status = StatusActive
	s.Ended = time.Time{}
	s.LastModified = now
	if s.Created.IsZero() {
		s.Created = now
	}
	s.Created = s.Created.UTC()
	if s.LastSeen.Before(s.Created) {
		s.LastSeen = s.Created
	}
	s.LastSeen = s.LastSeen.UTC()
	s.Attributes = cloneAttrs(s.Attributes)
	if err := errors.Join(checkSession(s), checkAttributes(s.Attributes)); err != nil {
		return Session{}, fmt.Errorf("create session %q: %w", s.ID, err)
	}
	if !s.ActiveAt(now) {
		return Session{}, fmt.Errorf("create session %q: %w: lapsed at creation (expires %v)", s.ID, ErrInvalid, s.ExpiresAt())
	}
	return s, nil
}

// checkUpdate checks what an Update's fn made of old and returns the session to store at now
// (every Store's rules).
func checkUpdate(id string, old, v Session, now time.Time) (Session, error) {
	v.LastSeen = v.LastSeen.UTC()
	switch {
	case v.ID != old.ID, v.Service != old.Service:
		return Session{}, fmt.Errorf("update session %q: %w: id and service are immutable", id, ErrInvalid)
	case v.Status != StatusActive, !v.Ended.IsZero():
		return Session{}, fmt.Errorf("update session %q: %w: use End to end a session", id, ErrInvalid)
	case !v.Created.Equal(old.Created):
		return Session{}, fmt.Errorf("update session %q: %w: created is immutable", id, ErrInvalid)
	}
	if err := errors.Join(checkSession(v), checkAttributes(v.Attributes)); err != nil {
		return Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	v.Created = old.Created
	v.LastModified = now
	v.Attributes = cloneAttrs(v.Attributes) // fn may keep a reference to the map it saw
	return v, nil
}

// retained reports whether the viewed record is still visible at now.
func (m *MemStore) retained(v Session, now time.Time) bool {
	return v.Status == StatusActive || now.Before(v.Ended.Add(m.retention))
}

// first returns the record (service, id) or nil.
func first(txn *memdb.Txn, service, id string) (*record, error) {
	raw, err := txn.First(tableSessions, indexID, service, id)
	if err != nil || raw == nil {
		return nil, err
	}
	return raw.(*record), nil
}

// endTxn stores s, the final state of old (whose hot entry the caller has killed), as an
// ended record and drops old's hot entry. It returns s with a private Attributes map.
func (m *MemStore) endTxn(txn *memdb.Txn, old *record, s Session) (Session, error) {
	s.Attributes = cloneAttrs(s.Attributes)
	if err := txn.Insert(tableSessions, &record{s: s}); err != nil {
		return Session{}, err
	}
	m.hot.remove(s.Service, s.ID, old.hot)
	s.Attributes = cloneAttrs(s.Attributes)
	return s, nil
}

// announce calls OnEnd for sessions that left Active in a committed transaction.
func (m *MemStore) announce(ended []Session) {
	fn := m.onEnd.Load()
	if fn == nil {
		return
	}
	for _, s := range ended {
		s.Attributes = cloneAttrs(s.Attributes) // the callback owns its copy
		(*fn)(EndEvent{Session: s, Local: true})
	}
}

// Create implements Store.
func (m *MemStore) Create(ctx context.Context, s Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := m.now()
	s, err := prepareNew(s, now)
	if err != nil {
		return err
	}

	txn := m.db.Txn(true)
	defer txn.Abort()
	var ended []Session
	old, err := first(txn, s.Service, s.ID)
	if err != nil {
		return fmt.Errorf("create session %q: %w", s.ID, err)
	}
	if old != nil && old.s.DisableReuse && (old.s.Status != StatusActive || !old.view(now).ActiveAt(now)) {
		// Judged inside the write transaction: no End, Update or Create can change the
		// record between this check and the insert below.
		if m.retained(old.view(now), now) {
			return fmt.Errorf("create session %q: %w", s.ID, ErrReuseDisabled)
		}
	}
	if old != nil && old.s.Status == StatusActive {
		prev, lapsed := old.killIfLapsed(now)
		if !lapsed {
			return fmt.Errorf("create session %q: %w", s.ID, ErrExists)
		}
		// The old session lapsed but the reaper has not ended it yet: end it here, so its
		// slot is announced free exactly once, and let the new record replace it.
		prev.Status, prev.Ended = StatusExpired, prev.ExpiresAt()
		prev.Attributes = cloneAttrs(prev.Attributes)
		ended = append(ended, prev)
	}
	r := &record{s: s, hot: newHotEntry(s)}
	if err := txn.Insert(tableSessions, r); err != nil {
		return fmt.Errorf("create session %q: %w", s.ID, err)
	}
	r.hot.rec.Store(r)
	m.hot.put(s.Service, s.ID, r.hot) // replaces a lapsed predecessor's entry
	txn.Commit()
	m.announce(ended)
	return nil
}

// Get implements Store.
func (m *MemStore) Get(ctx context.Context, service, id string) (Session, error) {
	if err := ctx.Err(); err != nil {
		return Session{}, err
	}
	// A live session is answered from its hot entry: no memdb read transaction, no
	// allocation (unless it has attributes). Ended, lapsed-and-reaped and unknown ids go to
	// memdb, the store of record.
	if e := m.hot.get(service, id); e != nil && e.word.Load() >= 0 {
		if r := e.rec.Load(); r != nil {
			now := m.now()
			if v := r.view(now); m.retained(v, now) {
				return v, nil
			}
		}
	}
	r, err := first(m.db.Txn(false), service, id)
	if err != nil {
		return Session{}, fmt.Errorf("get session %q: %w", id, err)
	}
	if r == nil {
		return Session{}, fmt.Errorf("get session %q: %w", id, ErrNotFound)
	}
	now := m.now()
	v := r.view(now)
	if !m.retained(v, now) {
		return Session{}, fmt.Errorf("get session %q: %w", id, ErrNotFound)
	}
	return v, nil
}

// Touch implements Store. It costs a sharded read lock, a map lookup and a compare-and-swap,
// and is visible at once (TouchDelay 0).
func (m *MemStore) Touch(_ context.Context, service, id string, now time.Time) {
	if e := m.hot.get(service, id); e != nil {
		e.touch(now.UnixNano())
	}
}

// Update implements Store. fn runs inside the store's write transaction: it must be quick.
func (m *MemStore) Update(ctx context.Context, service, id string, fn func(*Session) error) (Session, error) {
	if err := ctx.Err(); err != nil {
		return Session{}, err
	}
	now := m.now()
	txn := m.db.Txn(true)
	defer txn.Abort()
	old, err := first(txn, service, id)
	if err != nil {
		return Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	if old == nil {
		return Session{}, fmt.Errorf("update session %q: %w", id, ErrNotFound)
	}
	v := old.view(now)
	switch {
	case !m.retained(v, now):
		return Session{}, fmt.Errorf("update session %q: %w", id, ErrNotFound)
	case old.s.Status != StatusActive:
		return Session{}, fmt.Errorf("update session %q: %w", id, ErrEnded)
	case v.Status != StatusActive:
		return Session{}, fmt.Errorf("update session %q: %w", id, ErrExpired)
	}
	if err := fn(&v); err != nil {
		return Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	if v, err = checkUpdate(id, old.s, v, now); err != nil {
		return Session{}, err
	}
	r := &record{s: v, hot: old.hot}
	if err := txn.Insert(tableSessions, r); err != nil {
		return Session{}, fmt.Errorf("update session %q: %w", id, err)
	}
	r.hot.rec.Store(r)
	r.hot.setLimits(v)
	r.hot.advance(v.LastSeen.UnixNano())
	txn.Commit()
	return r.view(now), nil
}

// End implements Store.
func (m *MemStore) End(ctx context.Context, service, id string, status Status, now time.Time) (Session, error) {
	if err := ctx.Err(); err != nil {
		return Session{}, err
	}
	if status != StatusExpired && status != StatusTerminated {
		return Session{}, fmt.Errorf("end session %q: %w: status %q", id, ErrInvalid, status)
	}
	now = now.UTC()
	txn := m.db.Txn(true)
	defer txn.Abort()
	old, err := first(txn, service, id)
	if err != nil {
		return Session{}, fmt.Errorf("end session %q: %w", id, err)
	}
	if old == nil || !m.retained(old.view(now), now) {
		return Session{}, fmt.Errorf("end session %q: %w", id, ErrNotFound)
	}
	if old.s.Status != StatusActive {
		return Session{}, fmt.Errorf("end session %q: %w", id, ErrEnded)
	}
	s := old.kill()
	var lapsed bool
	if exp := s.ExpiresAt(); !now.Before(exp) {
		s.Status, s.Ended, lapsed = StatusExpired, exp, true
	} else {
		s.Status, s.Ended = status, now
	}
	s, err = m.endTxn(txn, old, s)
	if err != nil {
		return Session{}, fmt.Errorf("end session %q: %w", id, err)
	}
	txn.Commit()
	m.announce([]Session{s})
	if lapsed && status != StatusExpired {
		return Session{}, fmt.Errorf("end session %q: %w: %w", id, ErrEnded, ErrExpired)
	}
	return s, nil
}

// ActiveByInstance implements Store.
func (m *MemStore) ActiveByInstance(ctx context.Context, service, instance string) ([]Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	it, err := m.db.Txn(false).Get(tableSessions, indexInstance, service, instance)
	if err != nil {
		return nil, fmt.Errorf("sessions of %s/%s: %w", service, instance, err)
	}
	var out []Session
	for raw := it.Next(); raw != nil; raw = it.Next() {
		s := raw.(*record).merged()
		s.Attributes = cloneAttrs(s.Attributes)
		out = append(out, s)
	}
	return out, nil
}
