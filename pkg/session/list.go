package session

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"time"
)

// pageTokenVersion prefixes every page token, so the encoding can change later.
const pageTokenVersion = 1

// cursor is a position in (service, id) order: List returns sessions strictly after it.
type cursor struct {
	service, id string
	set         bool
}

// covers reports whether (service, id) is at or before the cursor.
func (c cursor) covers(service, id string) bool {
	return c.set && (service < c.service || service == c.service && id <= c.id)
}

// encodePageToken returns the opaque token for "after (service, id)": base64url of a version
// byte and the primary key. It names a position, not an offset, so it stays valid whatever is
// inserted or deleted before the next page is fetched.
func encodePageToken(service, id string) string {
	b := append([]byte{pageTokenVersion}, primaryKey(service, id)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(tok string) (cursor, error) {
	if tok == "" {
		return cursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 5 || b[0] != pageTokenVersion || b[len(b)-1] != 0 {
		return cursor{}, ErrInvalidPageToken
	}
	parts := bytes.Split(b[1:len(b)-1], []byte{0})
	if len(parts) != 2 || len(parts[0]) == 0 || len(parts[1]) == 0 {
		return cursor{}, ErrInvalidPageToken
	}
	return cursor{service: string(parts[0]), id: string(parts[1]), set: true}, nil
}

// listPlan is a range of the id index: every key starts with pkPrefix (the service's, when
// the filter names one).
type listPlan struct {
	pkPrefix []byte
	// in reports whether a record lies in the range; the scan stops at the first that does not.
	in func(*record) bool
}

// plan returns the range of the id index a filter needs. There are no instance or status
// indexes (each would cost a live session ~400 bytes, see indexID): List filters by them
// while it walks the service's ids in order.
func (f Filter) plan() listPlan {
	var svcPrefix []byte
	if f.Service != "" {
		svcPrefix = appendName(nil, f.Service)
	}
	return listPlan{pkPrefix: svcPrefix,
		in: func(r *record) bool { return f.Service == "" || r.service() == f.Service }}
}

// seek returns the first index key to visit for a cursor.
func (p listPlan) seek(after cursor) []byte {
	if after.set {
		if pk := primaryKey(after.service, after.id); bytes.Compare(pk, p.pkPrefix) > 0 {
			return pk
		}
	}
	return append([]byte(nil), p.pkPrefix...)
}

// match applies the whole filter to a viewed session.
func (f Filter) match(s Session) bool {
	return (f.Service == "" || s.Service == f.Service) &&
		(f.Instance == "" || s.Instance == f.Instance) &&
		(f.ID == "" || s.ID == f.ID) &&
		(f.Status == "" || s.Status == f.Status)
}

// List implements Store. Each page is read from one consistent memdb snapshot.
func (m *MemStore) List(ctx context.Context, f Filter, pageToken string, limit int) ([]Session, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	after, err := decodePageToken(pageToken)
	if err != nil {
		return nil, "", fmt.Errorf("list sessions: %w", err)
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	now := m.now()
	txn := m.db.Txn(false)

	if f.Service != "" && f.ID != "" {
		r, err := first(txn, f.Service, f.ID)
		if err != nil {
			return nil, "", fmt.Errorf("list sessions: %w", err)
		}
		if r == nil || after.covers(r.service(), r.id()) {
			return nil, "", nil
		}
		if v := m.view(r, now); m.retained(v, now) && f.match(v) {
			return []Session{v}, "", nil
		}
		return nil, "", nil
	}

	p := f.plan()
	it, err := txn.LowerBound(tableSessions, indexID, rawKey(p.seek(after)))
	if err != nil {
		return nil, "", fmt.Errorf("list sessions: %w", err)
	}
	var out []Session
	for n := 0; ; n++ {
		if n%1024 == 1023 {
			if err := ctx.Err(); err != nil {
				return nil, "", err
			}
		}
		raw := it.Next()
		if raw == nil {
			return out, "", nil
		}
		r := raw.(*record)
		if !p.in(r) {
			return out, "", nil
		}
		if after.covers(r.service(), r.id()) || !m.visible(r, f, now) {
			continue
		}
		if len(out) == limit {
			// One more match exists: the next page starts after the last one returned.
			last := out[len(out)-1]
			return out, encodePageToken(last.Service, last.ID), nil
		}
		out = append(out, m.view(r, now))
	}
}

// visible reports whether List shows the record under f at now, without building a copy.
func (m *MemStore) visible(r *record, f Filter, now time.Time) bool {
	if (f.ID != "" && r.id() != f.ID) || (f.Instance != "" && r.inst.name != f.Instance) {
		return false
	}
	s := m.stored(r)
	if s.Status == StatusActive && !now.Before(s.ExpiresAt()) {
		s.Status, s.Ended = StatusExpired, s.ExpiresAt()
	}
	return m.retained(s, now) && f.match(s)
}
