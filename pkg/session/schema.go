package session

import (
	"fmt"

	"github.com/hashicorp/go-memdb"
)

// Table and index names of the memdb schema.
const (
	tableSessions = "sessions"

	// indexID is unique: service\x00id\x00. Its byte order equals the (service, id) order
	// because names never contain NUL. It is the table's only index: each index entry costs
	// ~400 bytes of radix nodes and every insert opens a write transaction on every index
	// (memdb's Insert walks them all, even one that skips the record), so expiry is scheduled
	// outside memdb (reaper.go), live sessions are found by the hot table (hot.go) and counted
	// per instance by instGroup, and List filters by instance or status while it walks ids.
	indexID = "id"
)

// newSchema lists the store's tables. It panics on a duplicate table name, a programming error.
func newSchema() *memdb.DBSchema {
	db := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, t := range []*memdb.TableSchema{
		sessionsTableSchema(),
	} {
		if _, dup := db.Tables[t.Name]; dup {
			panic(fmt.Sprintf("session: duplicate memdb table %q", t.Name))
		}
		db.Tables[t.Name] = t
	}
	return db
}

// sessionsTableSchema declares the sessions table. Objects are *record and are never modified
// after insertion (but for their atomic hot word).
func sessionsTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: tableSessions,
		Indexes: map[string]*memdb.IndexSchema{
			indexID: {Name: indexID, Unique: true, Indexer: idIndexer{}},
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
	return true, raw.(*record).key(), nil
}

// FromArgs takes (service, id), a rawKey, or a *record whose key to look up (a pointer: no
// allocation to box it, none to build the key).
func (idIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) == 1 {
		if r, ok := args[0].(*record); ok {
			return r.key(), nil
		}
	}
	return stringArgs(2, args)
}

// PrefixFromArgs takes (service): every record of that service.
func (idIndexer) PrefixFromArgs(args ...any) ([]byte, error) { return stringArgs(1, args) }
