package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-memdb"
)

// reapBatchSize bounds the records one reaper transaction handles, so that a backlog (after a
// restore, or a burst of expiries) never holds memdb's writer lock for long. It also keeps a
// transaction under go-immutable-radix's 8192 tracked node channels per index: beyond that,
// Commit falls back to walking every node of the old and new trees (measured: a 4096-record
// batch in a 100k table spent two thirds of its time there).
const reapBatchSize = 512

// Reap ends every Active session that has lapsed by now (status Expired, Ended = its
// ExpiresAt, OnEnd called once for each) and deletes ended records older than the retention.
// It returns how many sessions it ended and how many records it purged. Run calls it every
// reap interval; tests and tools may call it directly. Safe for concurrent use.
//
// Why touched sessions are never expired by mistake: Touch does not write memdb, so the expiry
// index holds ExpiresAt computed from the LastSeen of the last write (creation, Update, or a
// previous reaper pass). Touches only move LastSeen forward, so the indexed time is never later
// than the real expiry: every lapsed session is found, and some found sessions are still alive.
// For each one the reaper re-reads the hot last-seen time and decides on that; a session that
// was touched in time is rewritten with its current LastSeen, which moves its indexed expiry to
// the real one (so a busy session costs one write per idle timeout, not one per request). A
// lapsed one is ended by a compare-and-swap on its hot word against the value it was judged
// on, so a Touch racing the reaper either lands first (the swap fails and the session is judged
// again, alive) or is refused afterwards: an accepted touch is never lost.
func (m *MemStore) Reap(ctx context.Context) (ended, purged int, err error) {
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

// firstDue returns the record the reaper must look at first, or nil.
func (m *MemStore) firstDue(txn *memdb.Txn) (*record, error) {
	raw, err := txn.First(tableSessions, indexExpiry)
	if err != nil || raw == nil {
		return nil, err
	}
	return raw.(*record), nil
}

// reapBatch handles up to reapBatchSize due records in one write transaction.
func (m *MemStore) reapBatch(now time.Time) (ended, purged int, more bool, err error) {
	// Look first without the writer lock: most ticks find nothing to do.
	if r, err := m.firstDue(m.db.Txn(false)); err != nil || r == nil || r.reapAt(m.retention).After(now) {
		return 0, 0, false, err
	}
	txn := m.db.Txn(true)
	defer txn.Abort()
	it, err := txn.Get(tableSessions, indexExpiry)
	if err != nil {
		return 0, 0, false, fmt.Errorf("reap sessions: %w", err)
	}
	var due []*record
	for raw := it.Next(); raw != nil; raw = it.Next() {
		r := raw.(*record)
		if r.reapAt(m.retention).After(now) {
			break
		}
		if len(due) == reapBatchSize {
			more = true
			break
		}
		due = append(due, r)
	}
	var gone []Session
	var errs []error
	for _, r := range due {
		if r.s.Status != StatusActive {
			errs = append(errs, txn.Delete(tableSessions, r))
			purged++
			continue
		}
		s, lapsed := r.killIfLapsed(now)
		if !lapsed {
			c := r.clone()
			c.s.LastSeen = s.LastSeen
			errs = append(errs, txn.Insert(tableSessions, c))
			c.hot.rec.Store(c)
			continue
		}
		s.Status, s.Ended = StatusExpired, s.ExpiresAt()
		s, err := m.endTxn(txn, r, s)
		errs = append(errs, err)
		gone = append(gone, s)
	}
	if err := errors.Join(errs...); err != nil {
		// Unreachable with this package's indexers; the aborted transaction changes nothing,
		// but hot entries killed above stay dead, which only makes Touch ignore them.
		return 0, 0, false, fmt.Errorf("reap sessions: %w", err)
	}
	txn.Commit()
	m.announce(gone)
	return len(gone), purged, more, nil
}

// Run ends lapsed sessions every reap interval and, with WithSnapshot, saves a snapshot every
// snapshot interval and once more when ctx ends. It blocks until ctx ends and returns nil then,
// or the error of that final snapshot. Periodic snapshot failures are logged and retried at the
// next interval. Only one Run may be active per store at a time.
func (m *MemStore) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errors.New("session: MemStore.Run is already running")
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
