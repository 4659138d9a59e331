package session

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hashicorp/go-memdb"
)

// Table and index names of the memdb schema.
const (
	tableSessions = "sessions"

	// indexID is unique: service\x00id\x00. Its byte order equals the (service, id) order
	// because names never contain NUL.
	indexID = "id"
	// indexInstance holds stored-Active records only: service\x00instance\x00 (+ primary key).
	indexInstance = "instance"
	// indexExpiry orders every record by when the reaper must next look at it: an Active
	// record's ExpiresAt as stored, an ended record's Ended+retention (+ primary key).
	indexExpiry = "expiry"
	// indexStatus groups ended records by status: status\x00 (+ primary key). Active records
	// are left out: they are most of the table, and an index entry costs ~400 bytes of radix
	// nodes; "all Active sessions" is served by the id index just as well.
	indexStatus = "status"
)

// newSchema lists the store's tables. It panics on a duplicate table name, a programming error.
func newSchema(retention time.Duration) *memdb.DBSchema {
	db := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, t := range []*memdb.TableSchema{
		sessionsTableSchema(retention),
	} {
		if _, dup := db.Tables[t.Name]; dup {
			panic(fmt.Sprintf("session: duplicate memdb table %q", t.Name))
		}
		db.Tables[t.Name] = t
	}
	return db
}

// sessionsTableSchema declares the sessions table. Objects are *record and are never modified
// after insertion.
//
// Non-unique memdb indexes append the primary key (service\x00id\x00) to every key, so inside
// any fixed value of the instance or status index the records are ordered by (service, id)
// as well: List relies on this to page through a narrower index.
func sessionsTableSchema(retention time.Duration) *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: tableSessions,
		Indexes: map[string]*memdb.IndexSchema{
			indexID:       {Name: indexID, Unique: true, Indexer: idIndexer{}},
			indexInstance: {Name: indexInstance, AllowMissing: true, Indexer: instanceIndexer{}},
			indexExpiry:   {Name: indexExpiry, Indexer: expiryIndexer{retention: retention}},
			indexStatus:   {Name: indexStatus, AllowMissing: true, Indexer: statusIndexer{}},
		},
	}
}

// rawKey is an index argument used verbatim as the index key (range scans with LowerBound).
type rawKey []byte

// appendName appends name and its NUL terminator.
func appendName(b []byte, name string) []byte {
	b = append(b, name...)
	return append(b, 0)
}

// primaryKey returns service\x00id\x00.
func primaryKey(service, id string) []byte {
	return appendName(appendName(make([]byte, 0, len(service)+len(id)+2), service), id)
}

// stringArgs builds a key from string arguments, or passes a single rawKey through.
func stringArgs(want int, args []any) ([]byte, error) {
	if len(args) == 1 {
		if k, ok := args[0].(rawKey); ok {
			return k, nil
		}
	}
	if len(args) != want {
		return nil, fmt.Errorf("want %d arguments, got %d", want, len(args))
	}
	n := 0
	for i, a := range args {
		s, ok := a.(string)
		if !ok {
			return nil, fmt.Errorf("argument %d: want string, got %T", i, a)
		}
		n += len(s) + 1
	}
	b := make([]byte, 0, n)
	for _, a := range args {
		b = appendName(b, a.(string))
	}
	return b, nil
}

// idIndexer indexes service\x00id\x00.
type idIndexer struct{}

func (idIndexer) FromObject(raw any) (bool, []byte, error) {
	r := raw.(*record)
	return true, primaryKey(r.s.Service, r.s.ID), nil
}

// FromArgs takes (service, id) or a rawKey.
func (idIndexer) FromArgs(args ...any) ([]byte, error) { return stringArgs(2, args) }

// PrefixFromArgs takes (service): every record of that service.
func (idIndexer) PrefixFromArgs(args ...any) ([]byte, error) { return stringArgs(1, args) }

// instanceIndexer indexes service\x00instance\x00 of stored-Active records; ended records are
// left out so ActiveByInstance does not wade through a day of retained history.
type instanceIndexer struct{}

func (instanceIndexer) FromObject(raw any) (bool, []byte, error) {
	r := raw.(*record)
	if r.s.Status != StatusActive {
		return false, nil, nil
	}
	b := make([]byte, 0, len(r.s.Service)+len(r.s.Instance)+2)
	return true, appendName(appendName(b, r.s.Service), r.s.Instance), nil
}

// FromArgs takes (service, instance) or a rawKey.
func (instanceIndexer) FromArgs(args ...any) ([]byte, error) { return stringArgs(2, args) }

// statusIndexer indexes status\x00 of ended records.
type statusIndexer struct{}

func (statusIndexer) FromObject(raw any) (bool, []byte, error) {
	r := raw.(*record)
	if r.s.Status == StatusActive {
		return false, nil, nil
	}
	return true, appendName(make([]byte, 0, len(r.s.Status)+1), string(r.s.Status)), nil
}

// FromArgs takes (status as string) or a rawKey.
func (statusIndexer) FromArgs(args ...any) ([]byte, error) { return stringArgs(1, args) }

// expiryIndexer indexes the reaper's deadline as 8 big-endian bytes (see timeKey).
type expiryIndexer struct{ retention time.Duration }

func (x expiryIndexer) FromObject(raw any) (bool, []byte, error) {
	r := raw.(*record)
	return true, timeKey(r.reapAt(x.retention)), nil
}

// FromArgs takes a rawKey (the reaper scans from the start of the index).
func (expiryIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) == 1 {
		if k, ok := args[0].(rawKey); ok {
			return k, nil
		}
	}
	return nil, fmt.Errorf("expiry index: want one raw key, got %d arguments", len(args))
}

// timeKey encodes t as fixed-width big-endian bytes whose byte order is time order (the sign
// bit is flipped so times before 1970 sort first).
func timeKey(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(t.UnixNano())^(1<<63))
}
