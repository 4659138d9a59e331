package memstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/tether-dev/tether/pkg/session"
)

// scan calls yield with the records of service (of every service, when service is "") in
// (service, id) order, starting after the cursor, until yield returns false. The id index
// holds each service's records in two ranges (tagHex, tagRaw); scan merges them by id.
func scan(txn *memdb.Txn, service string, after session.PageCursor, yield func(*record) bool) error {
	if service != "" {
		if after.Set && after.Service != service {
			if after.Service > service {
				return nil
			}
			after = session.PageCursor{}
		}
		_, err := scanService(txn, service, after, yield)
		return err
	}
	var from []byte
	if after.Set {
		from = appendName(nil, after.Service)
	}
	for {
		it, err := txn.LowerBound(tableSessions, indexID, rawKey(from))
		if err != nil {
			return err
		}
		raw := it.Next()
		if raw == nil {
			return nil
		}
		svc := objService(raw)
		c := after
		if c.Service != svc {
			c = session.PageCursor{}
		}
		if more, err := scanService(txn, svc, c, yield); err != nil || !more {
			return err
		}
		from = append(append(from[:0], svc...), 1) // the first key after every svc\x00...
	}
}

// scanService is scan of one service; it reports whether yield asked for more.
func scanService(txn *memdb.Txn, service string, after session.PageCursor, yield func(*record) bool) (bool, error) {
	base := appendName(nil, service)
	hexFrom := append(slices.Clip(base), tagHex)
	rawFrom := append(slices.Clip(base), tagRaw)
	hexAny := true
	if after.Set {
		var b hexKey
		b, hexAny = hexSeek(after.ID)
		// From the bucket that holds the seek key: next skips its records up to the cursor.
		hexFrom = append(hexFrom, b[:bucketNibbles]...)
		rawFrom = append(rawFrom, after.ID...)
	}
	hexes := tagRange{service: service, tag: tagHex, after: after}
	raws := tagRange{service: service, tag: tagRaw, after: after}
	if err := hexes.open(txn, hexFrom, hexAny); err != nil {
		return false, err
	}
	if err := raws.open(txn, rawFrom, true); err != nil {
		return false, err
	}
	h, r := hexes.next(), raws.next()
	for h != nil || r != nil {
		var rec *record
		// A generated id is never equal to another id: the tags tell them apart.
		if r == nil || h != nil && compareIDKeys(h.idPart(), r.idPart()) < 0 {
			rec, h = h, hexes.next()
		} else {
			rec, r = r, raws.next()
		}
		if !yield(rec) {
			return false, nil
		}
	}
	return true, nil
}

// tagRange walks the records of one service and tag in id order, skipping ids at or before
// a cursor.
type tagRange struct {
	it      recIter
	service string
	tag     byte
	after   session.PageCursor
}

// open starts the walk at index key from (on false: an empty walk).
func (t *tagRange) open(txn *memdb.Txn, from []byte, on bool) error {
	if !on {
		return nil
	}
	it, err := txn.LowerBound(tableSessions, indexID, rawKey(from))
	t.it = recIter{it: it}
	return err
}

// next returns the next record, or nil at the end of the range.
func (t *tagRange) next() *record {
	for r := t.it.next(); r != nil; r = t.it.next() {
		if r.service() != t.service || r.idPart()[0] != t.tag {
			break
		}
		if !t.after.Set || compareIDTo(r.idPart(), t.after.ID) > 0 {
			t.after = session.PageCursor{} // the range is in id order: every later record is after it too
			return r
		}
	}
	t.it = recIter{}
	return nil
}

// List implements session.Store. Each page is read from one consistent memdb snapshot.
func (m *Store) List(ctx context.Context, f session.Filter, pageToken string, limit int) ([]session.Session, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	after, err := session.DecodePageToken(pageToken)
	if err != nil {
		return nil, "", fmt.Errorf("list sessions: %w", err)
	}
	if limit <= 0 {
		limit = session.DefaultListLimit
	}
	limit = min(limit, session.MaxListLimit)
	now := m.now()
	txn := m.db.Txn(false)
	if f.Service != "" && f.ID != "" {
		out, err := m.listOne(txn, f, after, now)
		return out, "", err
	}
	return m.listPage(ctx, txn, f, after, limit, now)
}

// listOne is List of a filter naming both the service and the id: at most the one record, on
// one page.
func (m *Store) listOne(txn *memdb.Txn, f session.Filter, after session.PageCursor, now time.Time) ([]session.Session, error) {
	r, err := first(txn, f.Service, f.ID)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	if r == nil || after.Covers(r.service(), r.id()) {
		return nil, nil
	}
	if v := m.view(r, now); m.retained(v, now) && f.Match(v) {
		return []session.Session{v}, nil
	}
	return nil, nil
}

// listPage is List's page of up to limit records after the cursor, in (service, id) order,
// with the token of the next page when more match. It checks ctx every 1,024 records.
func (m *Store) listPage(ctx context.Context, txn *memdb.Txn, f session.Filter, after session.PageCursor, limit int, now time.Time) ([]session.Session, string, error) {
	var out []session.Session
	var next string
	var ctxErr error
	n := 0
	err := scan(txn, f.Service, after, func(r *record) bool {
		if n++; n%1024 == 0 {
			if ctxErr = ctx.Err(); ctxErr != nil {
				return false
			}
		}
		if !m.visible(r, f, now) {
			return true
		}
		if len(out) == limit {
			// One more match exists: the next page starts after the last one returned.
			last := out[len(out)-1]
			next = session.EncodePageToken(last.Service, last.ID)
			return false
		}
		out = append(out, m.view(r, now))
		return true
	})
	switch {
	case ctxErr != nil:
		return nil, "", ctxErr
	case err != nil:
		return nil, "", fmt.Errorf("list sessions: %w", err)
	}
	return out, next, nil
}

// visible reports whether List shows the record under f at now, without building a copy.
func (m *Store) visible(r *record, f session.Filter, now time.Time) bool {
	if f.ID != "" {
		if k := makeIDKey(f.ID); !r.hasKey(r.service(), &k) {
			return false
		}
	}
	if f.Instance != "" && r.bound.inst.name != f.Instance {
		return false
	}
	s := m.storedAs(r, r.service(), f.ID) // f.ID: the record's id, or "" when the filter has none
	if s.Status == session.StatusActive && !now.Before(s.ExpiresAt()) {
		s.Status, s.Ended = session.StatusExpired, s.ExpiresAt()
	}
	return m.retained(s, now) && f.Match(s)
}
