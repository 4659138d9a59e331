package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// reapBatchSize bounds the records one reaper transaction handles, so that a backlog (after a
// restore, or a burst of expiries) never holds memdb's writer lock for long. It also keeps a
// transaction under go-immutable-radix's 8192 tracked node channels per index: beyond that,
// Commit falls back to walking every node of the old and new trees (measured: a 4096-record
// batch in a 100k table spent two thirds of its time there).
const reapBatchSize = 512

// expiryItem schedules a look at record r at Unix nanoseconds at.
type expiryItem struct {
	at int64
	r  *record
}

// expiryHeap is the reaper's schedule, a min-heap on at, kept outside memdb (an expiry index
// would cost every session ~400 bytes of radix nodes). Every record version memdb holds has
// exactly one item, at or before the time it is due: an Active version at its ExpiresAt as of
// when it was scheduled (touches only move the real one later), an ended one at its
// Ended+retention. Items of versions that were replaced since are stale: the reaper drops them
// when they come up (see current). Guarded by memdb's writer lock.
type expiryHeap []expiryItem

// The heap is typed rather than a container/heap.Interface: boxing an item into an any cost
// an allocation on every push and pop, that is on every Create.

func (h *expiryHeap) push(it expiryItem) {
	*h = append(*h, it)
	h.up(len(*h) - 1)
}

// pop removes and returns the earliest item; the heap must not be empty.
func (h *expiryHeap) pop() expiryItem {
	old := *h
	n := len(old) - 1
	it := old[0]
	old[0] = old[n]
	old[n] = expiryItem{} // no record stays reachable from the spare capacity
	*h = old[:n]
	h.down(0)
	return it
}

func (h expiryHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if h[i].at <= h[j].at {
			return
		}
		h[i], h[j] = h[j], h[i]
		j = i
	}
}

func (h expiryHeap) down(i int) {
	for {
		j := 2*i + 1
		if j >= len(h) {
			return
		}
		if k := j + 1; k < len(h) && h[k].at < h[j].at {
			j = k
		}
		if h[i].at <= h[j].at {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

func (h expiryHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// ScheduledLen returns how many items the expiry schedule holds (current and stale); for
// tests and metrics. It takes memdb's writer lock.
func (m *Store) ScheduledLen() int {
	txn := m.writeTxn()
	defer txn.Abort()
	return len(m.expiry)
}

// schedule adds r's item. Writers only.
func (m *Store) schedule(r *record) {
	m.pushItem(expiryItem{at: m.reapAt(r), r: r})
}

func (m *Store) pushItem(it expiryItem) {
	m.expiry.push(it)
	m.publishDue()
}

func (m *Store) publishDue() {
	if len(m.expiry) == 0 {
		m.nextDue.Store(math.MaxInt64)
		return
	}
	m.nextDue.Store(m.expiry[0].at)
}

// Reap ends every Active session that has lapsed by now (status Expired, Ended = its
// ExpiresAt, OnEnd called once for each) and deletes ended records older than the retention.
// It returns how many sessions it ended and how many records it purged. Run calls it every
// reap interval; tests and tools may call it directly. Safe for concurrent use.
//
// Why touched sessions are never expired by mistake: Touch does not write memdb or the
// schedule, so a session's item holds the ExpiresAt computed from the LastSeen at its last
// scheduling (creation, Update, or a previous reaper pass). Touches only move LastSeen
// forward, so the scheduled time is never later than the real expiry: every lapsed session
// comes up, and some that come up are still alive. For each one the reaper re-reads the hot
// last-seen time and decides on that; a session that was touched in time is rescheduled at
// its real expiry (so a busy session costs one heap operation per idle timeout, not one per
// request). A lapsed one is ended by a compare-and-swap on its hot word against the value it
// was judged on, so a Touch racing the reaper either lands first (the swap fails and the
// session is judged again, alive) or is refused afterwards: an accepted touch is never lost.
func (m *Store) Reap(ctx context.Context) (ended, purged int, err error) {
	now := m.now()
	for ctx.Err() == nil {
		e, p, more, err := m.reapBatch(now)
		ended, purged = ended+e, purged+p
		if err != nil || !more {
			return ended, purged, err
		}
	}
	return ended, purged, ctx.Err()
}

// current reports whether r is still the version memdb holds under its key (the hot table
// mirrors the id index). Writers only.
func (m *Store) current(r *record) bool { return m.hot.current(r) == r }

// reapBatch handles up to reapBatchSize due items in one write transaction.
func (m *Store) reapBatch(now time.Time) (ended, purged int, more bool, err error) {
	// Look first without the writer lock: most ticks find nothing to do.
	if m.nextDue.Load() > now.UnixNano() {
		return 0, 0, false, nil
	}
	txn := m.writeTxn()
	defer txn.Abort()
	var gone []session.Session
	var errs []error
	for n := 0; len(m.expiry) > 0 && m.expiry[0].at <= now.UnixNano(); n++ {
		if n == reapBatchSize {
			more = true
			break
		}
		it := m.expiry.pop()
		r := it.r
		if !m.current(r) {
			continue // a later version has its own item
		}
		if !r.active() {
			if err := m.del(txn, r); err != nil {
				errs = append(errs, err)
				continue
			}
			m.account(txn, r, nil)
			purged++
			continue
		}
		if !killIfLapsed(r, now) {
			m.expiry.push(expiryItem{at: m.reapAt(r), r: r})
			continue
		}
		s := m.stored(r)
		s.Status, s.Ended = session.StatusExpired, s.ExpiresAt()
		s, err = m.endTxn(txn, r, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		gone = append(gone, s)
	}
	m.publishDue()
	if err := errors.Join(errs...); err != nil {
		// Unreachable with this package's indexers. The writer state followed each change
		// memdb accepted, so the transaction is committed with them.
		m.commit(txn, gone)
		return len(gone), purged, false, fmt.Errorf("reap sessions: %w", err)
	}
	m.commit(txn, gone)
	return len(gone), purged, more, nil
}

// compactExpiry drops the items of replaced versions when they outnumber the records, so that
// a session updated often cannot grow the schedule until its old items come due. Writers only.
func (m *Store) compactExpiry() {
	keep := m.expiry[:0]
	for _, it := range m.expiry {
		if m.current(it.r) {
			keep = append(keep, it)
		}
	}
	clear(m.expiry[len(keep):])
	m.expiry = keep
	m.expiry.init()
	m.publishDue()
}

// Run ends lapsed sessions every reap interval and, with WithSnapshot, saves a snapshot every
// snapshot interval and once more when its ctx ends. It blocks until ctx ends and returns nil then,
// or the error of that final snapshot. Periodic snapshot failures are logged and retried at the
// next interval. Only one Run may be active per store at a time.
func (m *Store) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errors.New("memstore: Store.Run is already running")
	}
	defer m.running.Store(false)

	reap := time.NewTicker(m.reapInterval)
	defer reap.Stop()
	var snapC <-chan time.Time
	if m.snapPath != "" {
		t := time.NewTicker(m.snapInterval)
		defer t.Stop()
		snapC = t.C
	}
	for {
		select {
		case <-ctx.Done():
			if m.snapPath == "" {
				return nil
			}
			if err := m.SaveSnapshot(m.snapPath); err != nil {
				return fmt.Errorf("final session snapshot: %w", err)
			}
			m.log.Info("saved session snapshot", "path", m.snapPath)
			return nil
		case <-reap.C:
			ended, purged, err := m.Reap(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				m.log.Error("reaping sessions failed", "err", err)
			case ended+purged > 0:
				m.log.Debug("reaped sessions", "ended", ended, "purged", purged)
			}
		case <-snapC:
			if err := m.SaveSnapshot(m.snapPath); err != nil {
				m.log.Warn("session snapshot failed", "path", m.snapPath, "err", err)
			}
		}
	}
}
