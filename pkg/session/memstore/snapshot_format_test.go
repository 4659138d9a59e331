package memstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// savedSnapshot returns the bytes SaveSnapshot writes for a small store of n sessions, some
// with attributes.
func savedSnapshot(t *testing.T, n int) []byte {
	t.Helper()
	st, _ := sessiontest.NewMemStore(t)
	for i := range n {
		s := sessiontest.Session("web", fmt.Sprintf("s%02d", i), fmt.Sprint("inst", i%3))
		if i%2 == 0 {
			s.Attributes = map[string]string{"user": fmt.Sprint("u", i)}
		}
		sessiontest.MustCreate(t, st, s)
	}
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// restoreBytes writes data to a file and restores it into a new store; it returns the count,
// how many sessions the store holds afterwards and the error.
func restoreBytes(t *testing.T, dir string, data []byte, opts ...memstore.Option) (int, int, error) {
	t.Helper()
	path := filepath.Join(dir, "s.snap")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	st, _ := sessiontest.NewMemStore(t, opts...)
	n, err := st.RestoreSnapshot(path)
	return n, len(sessiontest.Dump(t, st, session.Filter{}, 0)), err
}

// TestSnapshotRefusesDamagedFiles goes through the file: a flipped bit, a cut and an
// appended byte are refused as ErrSnapshotCorrupt naming the file, the store stays empty and
// the file is left as it was. (Every bit and every length are covered, without the file
// system, by TestDecodeSnapshotDetectsEveryBitFlipAndCut.)
func TestSnapshotRefusesDamagedFiles(t *testing.T) {
	good := savedSnapshot(t, 4)
	dir := t.TempDir()
	if n, _, err := restoreBytes(t, dir, good); n != 4 || err != nil {
		t.Fatalf("the undamaged file: %d, %v; want 4, nil", n, err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x10
	for name, bad := range map[string][]byte{
		"bit flipped":    flipped,
		"truncated":      good[:len(good)-1],
		"byte appended":  append(bytes.Clone(good), 0),
		"empty file":     {},
		"half the frame": good[:10],
	} {
		t.Run(name, func(t *testing.T) {
			n, held, err := restoreBytes(t, dir, bad)
			if !errors.Is(err, memstore.ErrSnapshotCorrupt) || held != 0 || n != 0 {
				t.Fatalf("restore = %d, %v, store holds %d; want ErrSnapshotCorrupt and nothing", n, err, held)
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, "s.snap")) {
				t.Errorf("error %q does not name the file", err)
			}
			if kept, rerr := os.ReadFile(filepath.Join(dir, "s.snap")); rerr != nil || !bytes.Equal(kept, bad) {
				t.Errorf("the refused file was changed (%v)", rerr)
			}
		})
	}
	if _, _, err := restoreBytes(t, dir, good[:len(good)-1]); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Errorf("truncated file: error %q should say checksum mismatch", err)
	}
}

// TestSnapshotFrame pins the documented version 2 frame: magic, version, payload, payload
// length, SHA-256; a future version with a valid checksum is refused by its number.
func TestSnapshotFrame(t *testing.T) {
	good := savedSnapshot(t, 2)
	if !bytes.HasPrefix(good, []byte("TTHRSNAP\x00\x00\x00\x02")) {
		t.Fatalf("file starts %q, want the magic and version 2", good[:12])
	}
	body := good[:len(good)-sha256.Size]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], good[len(body):]) {
		t.Fatal("the last 32 bytes are not the SHA-256 of the rest")
	}
	if n := binary.BigEndian.Uint64(body[len(body)-8:]); int(n) != len(body)-8-12 {
		t.Fatalf("payload length field %d, payload is %d bytes", n, len(body)-20)
	}
	future := bytes.Clone(body)
	binary.BigEndian.PutUint32(future[8:], 3)
	sum := sha256.Sum256(future)
	_, _, err := restoreBytes(t, t.TempDir(), append(future, sum[:]...))
	if !errors.Is(err, memstore.ErrSnapshotCorrupt) || !strings.Contains(err.Error(), "format version 3 is not supported") {
		t.Errorf("version 3: %v", err)
	}
}

// TestSnapshotReadsVersion1Unverified: a version 1 file (what the previous release wrote: a
// bare gob stream) still restores, so an upgrade keeps its sessions, with a warning that it
// was not verified; the next save writes version 2.
func TestSnapshotReadsVersion1Unverified(t *testing.T) {
	t0 := sessiontest.Start()
	s := sessiontest.Session("web", "old", "a")
	s.Created, s.LastModified, s.LastSeen, s.Status = t0, t0, t0, session.StatusActive
	dir := t.TempDir()
	path := filepath.Join(dir, "v1.snap")
	writeSnapshotFile(t, path, t0, []session.Session{s})
	var logs bytes.Buffer
	st, _ := sessiontest.NewMemStore(t, memstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if n, err := st.RestoreSnapshot(path); n != 1 || err != nil {
		t.Fatalf("restore v1 = %d, %v; want 1, nil", n, err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "no checksum") {
		t.Errorf("no warning about the unverified version 1 file:\n%s", logs.String())
	}
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(data, []byte("TTHRSNAP\x00\x00\x00\x02")) {
		t.Fatalf("the next save did not write version 2 (%v)", err)
	}
}

// TestMoveSnapshotAside renames the file out of the way, keeping its bytes, and never
// overwrites an earlier quarantined file.
func TestMoveSnapshotAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.snap")
	now := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	var moved []string
	for i := range 2 {
		content := fmt.Sprint("damaged ", i)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		to, err := memstore.MoveSnapshotAside(path, now)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(to); err != nil || string(got) != content {
			t.Fatalf("moved file %s holds %q, %v; want %q", to, got, err, content)
		}
		moved = append(moved, to)
	}
	want := []string{path + ".corrupt-20261201T093000Z", path + ".corrupt-20261201T093000Z.1"}
	if fmt.Sprint(moved) != fmt.Sprint(want) {
		t.Errorf("moved to %v, want %v", moved, want)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the snapshot is still at %s: %v", path, err)
	}
}
