package memstore

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/hashicorp/go-memdb"

	"github.com/tether-dev/tether/pkg/session"
)

// Table and index names of the memdb schema.
const (
	tableSessions = "sessions"

	// indexID is unique: service\x00, a tag and the id (see tagHex), or for a bucket of
	// generated ids the prefix they share (see bucket). Its byte order is the
	// service order (names never contain NUL), then the id order within each tag. It is the
	// table's only index: each index entry costs ~350 bytes of radix nodes and every insert
	// opens a write transaction on every index (memdb's Insert walks them all, even one that
	// skips the record), so expiry is scheduled outside memdb (reaper.go), records are found
	// by key through the hot table (hot.go) and counted per instance by instGroup, and List
	// filters by instance or status while it walks ids.
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

// The id part of a primary key: a tag byte, then the id in a form chosen by its shape.
//
//   - tagHex: a canonical id (IsGeneratedID: 32 lower-case hex characters, what NewID
//     returns) as a hexKey of 18 bytes: its first 4 digits one per byte, the other 28 two per
//     byte. Random hex one digit per byte spreads 1M ids over 16-way radix nodes about five
//     levels deep, and the sparse last level alone costs some 260k inner nodes (~200 bytes of
//     node, channel and edges each). Two digits per byte make 256-way nodes, two levels for
//     1M ids, but go-immutable-radix copies every node on an insert's path, edges included:
//     two full 256-way nodes are 8 KB of garbage per insert. Four 16-way levels (65536 nodes
//     of ~15 ids at 1M) and then bytes keep both small: few inner nodes, a ~1.5 KB path copy.
//   - tagRaw: any other id, verbatim.
//
// Within a tag, key order is id order (digits sort like their values). The two ranges are
// merged by id in scan, so List, ActiveByInstance and snapshots see (service, id) order.
const (
	tagHex byte = 1
	tagRaw byte = 2
)

// hexNibbles is how many leading digits of a generated id a hexKey keeps one per byte.
const hexNibbles = 4

// hexKey is the tagHex payload of a generated id.
type hexKey [hexNibbles + (session.IDLen-hexNibbles)/2]byte

// hexVal maps a lower-case hex digit to its value and every other byte to 0xff.
var hexVal = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
	}
	return t
}()

// packHex packs a generated id into b and reports whether id was one.
func packHex(id string, b *hexKey) bool {
	if len(id) != session.IDLen {
		return false
	}
	var bad byte
	for i := range hexNibbles {
		v := hexVal[id[i]]
		bad |= v
		b[i] = v
	}
	for i := hexNibbles; i < len(b); i++ {
		j := 2*i - hexNibbles
		hi, lo := hexVal[id[j]], hexVal[id[j+1]]
		bad |= hi | lo
		b[i] = hi<<4 | lo
	}
	return bad&0xf0 == 0
}

// unpackHex writes the generated id of a tagHex payload to dst.
func unpackHex(dst *[session.IDLen]byte, payload string) {
	const digits = "0123456789abcdef"
	for i := range hexNibbles {
		dst[i] = digits[payload[i]&0xf]
	}
	for i := hexNibbles; i < len(payload); i++ {
		j := 2*i - hexNibbles
		dst[j], dst[j+1] = digits[payload[i]>>4], digits[payload[i]&0xf]
	}
}

// idKey is the id part of a primary key, built on the stack for a lookup.
type idKey struct {
	tag byte
	bin hexKey
	raw string
}

func makeIDKey(id string) (k idKey) {
	if packHex(id, &k.bin) {
		k.tag = tagHex
	} else {
		k.tag, k.raw = tagRaw, id
	}
	return k
}

// appendIDKey appends the id part of a primary key: its tag and payload.
func appendIDKey(b []byte, id string) []byte {
	var bin hexKey
	if packHex(id, &bin) {
		return append(append(b, tagHex), bin[:]...)
	}
	return append(append(b, tagRaw), id...)
}

// appendName appends name and its NUL terminator.
func appendName(b []byte, name string) []byte {
	b = append(b, name...)
	return append(b, 0)
}

// idOfKey returns the id a key's id part (tag and payload) stands for.
func idOfKey(k string) string {
	if k[0] != tagHex {
		return k[1:]
	}
	b := make([]byte, session.IDLen)
	unpackHex((*[session.IDLen]byte)(b), k[1:])
	return unsafe.String(unsafe.SliceData(b), session.IDLen)
}

// compareIDKeys orders two id parts by the ids they stand for, without building them.
func compareIDKeys(a, b string) int {
	if a[0] == b[0] {
		return strings.Compare(a[1:], b[1:]) // within a tag, key order is id order
	}
	if a[0] == tagHex {
		return compareIDTo(a, b[1:])
	}
	return -compareIDTo(b, a[1:])
}

// compareIDTo orders the id an id part stands for against id, without building it.
func compareIDTo(part, id string) int {
	if part[0] != tagHex {
		return strings.Compare(part[1:], id)
	}
	var buf [session.IDLen]byte
	unpackHex(&buf, part[1:])
	return strings.Compare(unsafe.String(&buf[0], session.IDLen), id) // a conversion would allocate
}

// hexSeek returns the smallest payload whose id is greater than or equal to the
// smallest canonical id greater than after, i.e. where a tagHex range scan that must skip
// every id <= after may start; ok is false when no canonical id is greater than after.
func hexSeek(after string) (b hexKey, ok bool) {
	k := 0
	for k < len(after) && k < session.IDLen && hexVal[after[k]] != 0xff {
		k++
	}
	var digits [session.IDLen]byte
	copy(digits[:], after[:k])
	for i := k; i < session.IDLen; i++ {
		digits[i] = '0'
	}
	if k < session.IDLen && k < len(after) {
		// after = p c ..., c not a hex digit: the ids p d 0... with the first hex digit d > c.
		switch c := after[k]; {
		case c < '0':
			digits[k] = '0'
		case c < 'a':
			digits[k] = 'a'
		default: // above 'f': the first id after every p...
			i := k - 1
			for ; i >= 0 && digits[i] == 'f'; i-- {
				digits[i] = '0'
			}
			if i < 0 {
				return b, false
			}
			if digits[i] == '9' {
				digits[i] = 'a'
			} else {
				digits[i]++
			}
		}
	}
	packHex(string(digits[:]), &b)
	return b, true
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

// idIndexer indexes service\x00 and the id part (see tagHex).
type idIndexer struct{}

// FromObject takes a memdb object: a *bucket (its key) or a *record (its bucket key, or its
// primary key for a raw id); see bucket.
func (idIndexer) FromObject(raw any) (bool, []byte, error) {
	var k string
	switch o := raw.(type) {
	case *bucket:
		k = o.key
	case *record:
		k = o.objKey()
	default:
		return false, nil, fmt.Errorf("session: memdb object of type %T", raw)
	}
	return true, unsafe.Slice(unsafe.StringData(k), len(k)), nil
}

// FromArgs takes (service, id) (the key of the object that holds that record), a rawKey, or
// a bucketArg.
func (idIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) == 1 {
		switch a := args[0].(type) {
		case rawKey:
			return a, nil
		case bucketArg:
			k := a.r.bucketKey()
			return unsafe.Slice(unsafe.StringData(k), len(k)), nil
		}
	}
	if len(args) != 2 {
		return nil, fmt.Errorf("want 2 arguments, got %d", len(args))
	}
	service, ok := args[0].(string)
	id, ok2 := args[1].(string)
	if !ok || !ok2 {
		return nil, fmt.Errorf("want (service, id) strings, got (%T, %T)", args[0], args[1])
	}
	k := makeIDKey(id)
	return objKey(service, &k), nil
}

// PrefixFromArgs takes (service): every record of that service.
func (idIndexer) PrefixFromArgs(args ...any) ([]byte, error) { return stringArgs(1, args) }
