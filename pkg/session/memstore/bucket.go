package memstore

import (
	"slices"
	"strings"

	"github.com/hashicorp/go-memdb"
)

// Records with generated ids are kept in memdb in buckets, not one object each: a memdb
// object costs a radix leaf of ~340 bytes whatever it holds (a node and a leaf, each with
// its own mutation channel, and an edge in its parent), which was two thirds of a live
// session's heap. A bucket holds every record of one service whose generated id starts with
// the same bucketNibbles hex digits (at most 65536 buckets a service): ~15 records a bucket
// at 1M sessions, ~150 at 10M, so the leaf and the bucket cost a few tens of bytes a
// session. Buckets are immutable once committed, like records: a writer copies a bucket to
// change it (8 bytes a record it holds; a change also copies the radix path, as any memdb
// write does), except a bucket that the same write transaction made, which no reader can
// see yet and which is changed in place (a reaper batch or a restore touches one bucket many
// times). Records with other ids (tagRaw: a client's or a SIP Call-ID, of any shape, that
// could share any prefix) stay one memdb object each, and so does a generated-id record
// alone in its bucket (under the bucket key, without a bucket around it: with fewer than
// ~100k sessions most buckets would hold one record, and a bucket costs ~56 bytes more).
//
// The bucket key is a prefix of its records' primary keys (service\x00, tagHex, the first
// bucketNibbles bytes of the hexKey), so the id index, walked in key order, yields buckets
// and raw records in (service, id-part) order, and a bucket's records are sorted by key.
type bucket struct {
	key  string    // service\x00 tagHex and the first bucketNibbles payload bytes
	recs []*record // sorted by pk; at least two once committed
	gen  uint64    // the write transaction that made it (Store.txnGen)
}

// bucketNibbles is how many leading hex digits of a generated id choose its bucket. It must
// not exceed hexNibbles: the bucket key is a prefix of the hexKey's one-digit-a-byte part.
const bucketNibbles = 4

// bucketKeyLen returns the length of the bucket key of a tagHex primary key of service.
func bucketKeyLen(service string) int { return len(service) + 2 + bucketNibbles }

// bucketed reports whether r lives in a bucket (its id is a generated one).
func (r *record) bucketed() bool { return r.pk[int(r.svcLen)+1] == tagHex }

// bucketKey returns the key of the bucket r belongs in (r must be bucketed).
func (r *record) bucketKey() string { return r.pk[:bucketKeyLen(r.service())] }

// objKey returns the id index key of r as a memdb object of its own: its bucket key for a
// generated id, its primary key for any other.
func (r *record) objKey() string {
	if r.bucketed() {
		return r.bucketKey()
	}
	return r.pk
}

// objKey returns the id index key of the memdb object that holds (service, k): its bucket's
// key for a generated id (a bucket, or the one record it would hold), its primary key for
// any other.
func objKey(service string, k *idKey) []byte {
	b := make([]byte, 0, len(service)+2+len(k.bin)+len(k.raw))
	b = append(append(appendName(b, service), k.tag), k.raw...)
	if k.tag == tagHex {
		b = append(b, k.bin[:bucketNibbles]...)
	}
	return b
}

// objService returns the service of a memdb object.
func objService(raw any) string {
	switch o := raw.(type) {
	case *record:
		return o.service()
	case *bucket:
		return o.key[:strings.IndexByte(o.key, 0)]
	}
	return ""
}

// search returns the position of pk in the bucket's records and whether it is there.
func (b *bucket) search(pk string) (int, bool) {
	return slices.BinarySearchFunc(b.recs, pk, func(r *record, pk string) int { return strings.Compare(r.pk, pk) })
}

// first returns the record (service, id) or nil.
func first(txn *memdb.Txn, service, id string) (*record, error) {
	k := makeIDKey(id)
	raw, err := txn.First(tableSessions, indexID, rawKey(objKey(service, &k)))
	if err != nil || raw == nil {
		return nil, err
	}
	switch o := raw.(type) {
	case *record:
		if o.hasKey(service, &k) {
			return o, nil
		}
	case *bucket:
		pk := makePK(service, &k)
		if i, ok := o.search(pk); ok {
			return o.recs[i], nil
		}
	}
	return nil, nil
}

// writeTxn opens memdb's write transaction (taking its writer lock) and starts a new
// generation of buckets that it may change in place.
func (m *Store) writeTxn() *memdb.Txn {
	txn := m.db.Txn(true)
	m.txnGen++
	return txn
}

// bucketArg is an index argument standing for the bucket key of its record (a pointer-shaped
// struct: boxing it allocates nothing, and the key is the record's own bytes).
type bucketArg struct{ r *record }

// bucketOf returns the memdb object under r's bucket key in txn: nil, the one record of the
// bucket (lone), or the bucket.
func bucketOf(txn *memdb.Txn, r *record) (lone *record, b *bucket, err error) {
	raw, err := txn.First(tableSessions, indexID, bucketArg{r}) // boxed without an allocation
	if err != nil || raw == nil {
		return nil, nil, err
	}
	if lone, ok := raw.(*record); ok {
		return lone, nil, nil
	}
	return nil, raw.(*bucket), nil
}

// put stores r in memdb in place of the record of its key, if any. Writers only.
func (m *Store) put(txn *memdb.Txn, r *record) error {
	if !r.bucketed() {
		return txn.Insert(tableSessions, r)
	}
	lone, b, err := bucketOf(txn, r)
	switch {
	case err != nil:
		return err
	case lone == nil && b == nil, lone != nil && lone.pk == r.pk:
		return txn.Insert(tableSessions, r)
	case lone != nil:
		recs := []*record{lone, r}
		if r.pk < lone.pk {
			recs[0], recs[1] = r, lone
		}
		return txn.Insert(tableSessions, &bucket{key: lone.bucketKey(), recs: recs, gen: m.txnGen})
	}
	i, found := b.search(r.pk)
	if b.gen != m.txnGen {
		n := len(b.recs)
		if !found {
			n++
		}
		b = &bucket{key: b.key, recs: append(make([]*record, 0, n), b.recs...), gen: m.txnGen}
	}
	if found {
		b.recs[i] = r
	} else {
		b.recs = slices.Insert(b.recs, i, r)
	}
	return txn.Insert(tableSessions, b)
}

// del removes r from memdb (it must be the record of its key). Writers only.
func (m *Store) del(txn *memdb.Txn, r *record) error {
	if !r.bucketed() {
		return txn.Delete(tableSessions, r)
	}
	lone, b, err := bucketOf(txn, r)
	switch {
	case err != nil:
		return err
	case lone != nil && lone.pk == r.pk:
		return txn.Delete(tableSessions, lone)
	case b == nil:
		return memdb.ErrNotFound
	}
	i, found := b.search(r.pk)
	if !found {
		return memdb.ErrNotFound
	}
	if len(b.recs) == 2 {
		return txn.Insert(tableSessions, b.recs[1-i]) // alone again: no bucket around it
	}
	if b.gen == m.txnGen {
		b.recs = slices.Delete(b.recs, i, i+1)
	} else {
		recs := make([]*record, 0, len(b.recs)-1)
		b = &bucket{key: b.key, recs: append(append(recs, b.recs[:i]...), b.recs[i+1:]...), gen: m.txnGen}
	}
	return txn.Insert(tableSessions, b)
}

// recIter walks the records of a memdb iterator over the id index: a record of its own, or
// each of a bucket's records in order.
type recIter struct {
	it   memdb.ResultIterator
	rest []*record
}

// next returns the next record or nil at the end.
func (ri *recIter) next() *record {
	for len(ri.rest) == 0 {
		if ri.it == nil {
			return nil
		}
		switch o := ri.it.Next().(type) {
		case *record:
			return o
		case *bucket:
			ri.rest = o.recs
		default: // nil: the end
			ri.it = nil
			return nil
		}
	}
	r := ri.rest[0]
	ri.rest = ri.rest[1:]
	return r
}
