package memstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"testing"
)

// frame wraps payload in a valid version 2 frame (magic, version, length, checksum), so the
// fuzzer reaches the gob decoder and the record checks behind the checksum.
func frame(payload []byte) []byte {
	b := append([]byte(snapshotMagic), 0, 0, 0, snapshotVersion)
	b = append(b, payload...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(payload)))
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

// FuzzDecodeSnapshot feeds arbitrary file contents to the snapshot decoder, both as they are
// and framed with a valid checksum: it never panics, and whatever it accepts survives a
// write and a second decode unchanged (same records).
func FuzzDecodeSnapshot(f *testing.F) {
	good := internalSnapshot(f, 3)
	f.Add(good, false)
	f.Add(good[snapshotPrefix:len(good)-snapshotTrailer], true) // the payload alone
	f.Add([]byte{}, false)
	f.Add([]byte("TTHRSNAP\x00\x00\x00\x02"), false)
	f.Add([]byte("not gob"), true)
	st := New(WithClock(fixedNow))
	f.Fuzz(func(t *testing.T, data []byte, framed bool) {
		if framed {
			data = frame(data)
		}
		recs, _, err := st.decodeSnapshot(data)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := st.writeSnapshot(&buf, recs); err != nil {
			t.Fatalf("re-encoding accepted records: %v", err)
		}
		again, v, err := st.decodeSnapshot(buf.Bytes())
		if err != nil || v != snapshotVersion || len(again) != len(recs) {
			t.Fatalf("round trip: %d records, version %d, %v; want %d", len(again), v, err, len(recs))
		}
		for i := range recs {
			if a, b := st.stored(recs[i]), st.stored(again[i]); a.ID != b.ID || a.Service != b.Service || a.Instance != b.Instance ||
				a.Status != b.Status || !a.LastSeen.Equal(b.LastSeen) || len(a.Attributes) != len(b.Attributes) {
				t.Fatalf("record %d changed in the round trip: %+v -> %+v", i, a, b)
			}
		}
	})
}
