package memstore

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// fixedNow is the clock of the internal snapshot tests.
func fixedNow() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// internalSnapshot returns the bytes SaveSnapshot writes for n sessions, some with attributes.
func internalSnapshot(t testing.TB, n int) []byte {
	t.Helper()
	st := New(WithClock(fixedNow))
	for i := range n {
		s := session.Session{ID: fmt.Sprintf("s%02d", i), Service: "web", Instance: fmt.Sprint("inst", i%3),
			Kind: session.KindCookie, TTL: 6 * time.Hour, IdleTimeout: 30 * time.Minute}
		if i%2 == 0 {
			s.Attributes = map[string]string{"user": fmt.Sprint("u", i)}
		}
		if err := st.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	it, err := st.db.Txn(false).Get(tableSessions, indexID)
	if err != nil {
		t.Fatal(err)
	}
	var recs []*record
	ri := recIter{it: it}
	for r := ri.next(); r != nil; r = ri.next() {
		recs = append(recs, r)
	}
	if err := st.writeSnapshot(&buf, recs); err != nil {
		t.Fatal(err)
	}
	// The bytes are those of the file SaveSnapshot writes.
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestDecodeSnapshotDetectsEveryBitFlipAndCut is the regression test for the snapshot
// finding of issue 14 (28 of 40 single-bit flips of a version 1 file loaded silently): each
// of the file's bits is flipped in turn, and the file is cut at every length; every damaged
// file is refused.
func TestDecodeSnapshotDetectsEveryBitFlipAndCut(t *testing.T) {
	good := internalSnapshot(t, 6)
	st := New(WithClock(fixedNow))
	if recs, v, err := st.decodeSnapshot(good); len(recs) != 6 || v != snapshotVersion || err != nil {
		t.Fatalf("the undamaged file: %d records, version %d, %v", len(recs), v, err)
	}
	missed := 0
	for bit := range len(good) * 8 {
		bad := bytes.Clone(good)
		bad[bit/8] ^= 1 << (bit % 8)
		if recs, _, err := st.decodeSnapshot(bad); err == nil {
			missed++
			if missed <= 5 {
				t.Errorf("bit %d (byte %d of %d) flipped: decoded %d records, no error", bit, bit/8, len(good), len(recs))
			}
		}
	}
	if missed > 0 {
		t.Errorf("%d of %d single-bit flips loaded", missed, len(good)*8)
	}
	for n := range len(good) {
		if _, _, err := st.decodeSnapshot(good[:n]); err == nil {
			t.Errorf("cut to %d of %d bytes: decoded", n, len(good))
		}
	}
	if _, _, err := st.decodeSnapshot(append(bytes.Clone(good), 0)); err == nil {
		t.Error("one byte appended: decoded")
	}
}
