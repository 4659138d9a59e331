package memstore

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/pkg/session"
)

// Snapshot file format, version 2 (written since issue 14):
//
//	offset  size  content
//	0       8     magic "TTHRSNAP"
//	8       4     format version, big-endian uint32 (2)
//	12      n     payload: an encoding/gob stream of a snapshotHeader followed by exactly
//	              Count snapshotSession values ordered by (service, id)
//	12+n    8     n, big-endian uint64
//	20+n    32    SHA-256 of bytes [0, 20+n)
//
// A reader checks the magic, the version, the length and the checksum before it decodes
// anything, so a flipped bit, a torn or truncated file or trailing garbage is refused as
// ErrSnapshotCorrupt rather than loaded. gob rather than JSON lines because it decodes 100k
// sessions about ten times faster and keeps ids byte-exact (JSON would replace invalid UTF-8
// in a client-chosen id). The payload is then held to the same rules as before: its header
// must name snapshotFormat and the payload version, and the stream must hold exactly Count
// valid, ordered sessions. Fields may be added to snapshotSession without a version bump (gob
// ignores unknown fields and zeroes missing ones); any change of meaning bumps the version.
//
// Version 1 (the file is the bare gob stream, no magic and no checksum) is still read, so that
// an upgrade keeps its sessions: it is logged as unverified, and the next periodic snapshot
// rewrites the file as version 2. Nothing writes version 1.
const (
	snapshotFormat  = "tether-sessions"
	snapshotVersion = 2
	// snapshotVersionGobOnly is the unframed version 1 format, read for upgrades only.
	snapshotVersionGobOnly = 1

	snapshotMagic    = "TTHRSNAP"
	snapshotPrefix   = len(snapshotMagic) + 4
	snapshotTrailer  = 8 + sha256.Size
	snapshotMinFrame = snapshotPrefix + snapshotTrailer
)

// ErrSnapshotCorrupt marks a snapshot file that exists but cannot be trusted: wrong magic or
// version, a checksum mismatch, a truncated or over-long file, or a payload that does not
// decode into valid sessions. Read errors of the file system are not ErrSnapshotCorrupt.
var ErrSnapshotCorrupt = errors.New("snapshot is corrupt")

type snapshotHeader struct {
	Format  string
	Version int
	SavedAt time.Time
	Count   int
}

type snapshotSession struct {
	ID, Service, Instance string
	Kind                  session.Kind
	Created               time.Time
	LastModified          time.Time
	LastSeen              time.Time
	TTL, IdleTimeout      time.Duration
	Status                session.Status
	DisableReuse          bool
	Ended                 time.Time
	Attributes            map[string]string
}

// SaveSnapshot writes every record (LastSeen including touches) to path atomically: it writes
// path+".tmp" (mode 0600: session ids are bearer credentials), fsyncs it, renames it over path
// and fsyncs the directory. A failure or crash at any point leaves the previous file at path
// intact; on failure the temporary file is removed. The store itself is never changed. The
// records are read from one consistent memdb snapshot, so writers are never blocked. Calls are
// serialised.
func (m *Store) SaveSnapshot(path string) (err error) {
	m.snapMu.Lock()
	defer m.snapMu.Unlock()

	var recs []*record
	if err := scan(m.db.Txn(false), "", session.PageCursor{}, func(r *record) bool {
		recs = append(recs, r)
		return true
	}); err != nil {
		return fmt.Errorf("save session snapshot: %w", err)
	}

	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save session snapshot: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
			err = fmt.Errorf("save session snapshot %s: %w", path, err)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := m.writeSnapshot(bw, recs); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// writeSnapshot writes recs to w in the framed version 2 format.
func (m *Store) writeSnapshot(w io.Writer, recs []*record) error {
	fw := &frameWriter{w: w, sum: sha256.New()}
	var prefix [snapshotPrefix]byte
	copy(prefix[:], snapshotMagic)
	binary.BigEndian.PutUint32(prefix[len(snapshotMagic):], snapshotVersion)
	if _, err := fw.Write(prefix[:]); err != nil {
		return err
	}
	fw.n = 0 // count the payload only
	enc := gob.NewEncoder(fw)
	hdr := snapshotHeader{Format: snapshotFormat, Version: snapshotVersion, SavedAt: m.now(), Count: len(recs)}
	if err := enc.Encode(hdr); err != nil {
		return err
	}
	for _, r := range recs {
		s := m.stored(r)
		// A conversion, not a literal: it stops compiling when Session gains a field, so the
		// snapshot cannot silently drop one.
		if err := enc.Encode(snapshotSession(s)); err != nil {
			return err
		}
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(fw.n))
	if _, err := fw.Write(n[:]); err != nil {
		return err
	}
	_, err := w.Write(fw.sum.Sum(nil))
	return err
}

// frameWriter passes writes to w, hashing and counting them.
type frameWriter struct {
	w   io.Writer
	sum hash.Hash
	n   int64
}

func (fw *frameWriter) Write(p []byte) (int, error) {
	n, err := fw.w.Write(p)
	fw.sum.Write(p[:n])
	fw.n += int64(n)
	return n, err
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// RestoreSnapshot loads a snapshot written by SaveSnapshot into this store, which must be
// empty, and returns how many records it restored. A missing file restores nothing (0, nil).
// The load is all or nothing: a malformed, truncated or unknown-version file changes nothing
// and the error wraps ErrSnapshotCorrupt; the file itself is never changed (see
// MoveSnapshotAside).
//
// Times are judged by the store's clock: a session that lapsed while the process was down is
// restored as Expired (Ended = its ExpiresAt) and ended records past the retention are dropped.
// Restore announces nothing through OnEnd: slot owners must recount from ActiveByInstance once
// the restore has returned, and from then on every session leaving Active is announced.
// Call it before Run and before serving requests.
func (m *Store) RestoreSnapshot(path string) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("restore session snapshot: %w", err)
	}
	data, err := io.ReadAll(f)
	_ = f.Close() // opened read-only: closing cannot lose data
	if err != nil {
		return 0, fmt.Errorf("restore session snapshot %s: %w", path, err)
	}
	recs, version, err := m.decodeSnapshot(data)
	if err != nil {
		return 0, fmt.Errorf("restore session snapshot %s: %w: %w", path, ErrSnapshotCorrupt, err)
	}
	if version == snapshotVersionGobOnly {
		m.log.Warn("session snapshot is in format version 1, which has no checksum: loaded unverified; the next snapshot is written as version 2",
			"path", path)
	}

	txn := m.writeTxn()
	defer txn.Abort()
	if raw, err := txn.First(tableSessions, indexID); err != nil || raw != nil {
		return 0, fmt.Errorf("restore session snapshot %s: store is not empty", path)
	}
	for _, r := range recs {
		if err := m.insert(txn, nil, r); err != nil {
			return 0, fmt.Errorf("restore session snapshot %s: %w", path, err)
		}
	}
	txn.Commit()
	m.log.Info("restored session snapshot", "path", path, "records", len(recs))
	return len(recs), nil
}

// decodeSnapshot checks the frame of a snapshot file's content and decodes its payload into
// records ready to insert; it returns the format version it read. Content without the magic
// is read as version 1.
func (m *Store) decodeSnapshot(data []byte) ([]*record, int, error) {
	if !bytes.HasPrefix(data, []byte(snapshotMagic)) {
		recs, err := m.readPayload(data, snapshotVersionGobOnly)
		return recs, snapshotVersionGobOnly, err
	}
	if len(data) < snapshotMinFrame {
		return nil, 0, fmt.Errorf("%d bytes: shorter than an empty snapshot (truncated?)", len(data))
	}
	if v := binary.BigEndian.Uint32(data[len(snapshotMagic):]); v != snapshotVersion {
		return nil, 0, fmt.Errorf("format version %d is not supported (this build reads %d and %d)",
			v, snapshotVersionGobOnly, snapshotVersion)
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, 0, errors.New("checksum mismatch (damaged, truncated or torn file)")
	}
	payload := body[snapshotPrefix : len(body)-8]
	if n := binary.BigEndian.Uint64(body[len(body)-8:]); n != uint64(len(payload)) {
		return nil, 0, fmt.Errorf("payload length %d, frame says %d", len(payload), n)
	}
	recs, err := m.readPayload(payload, snapshotVersion)
	return recs, snapshotVersion, err
}

// readPayload decodes and validates a snapshot's gob stream into records ready to insert.
func (m *Store) readPayload(payload []byte, version int) ([]*record, error) {
	dec := gob.NewDecoder(bytes.NewReader(payload))
	var hdr snapshotHeader
	if err := dec.Decode(&hdr); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if hdr.Format != snapshotFormat || hdr.Version != version {
		return nil, fmt.Errorf("unsupported format %q version %d (want %q version %d)",
			hdr.Format, hdr.Version, snapshotFormat, version)
	}
	if hdr.Count < 0 {
		return nil, fmt.Errorf("negative count %d", hdr.Count)
	}
	now := m.now()
	// The capacity is bounded by the payload too: every record takes well over 8 bytes.
	recs := make([]*record, 0, min(hdr.Count, 1<<20, len(payload)/8))
	var prev *session.Session
	for n := 1; ; n++ {
		var ss snapshotSession
		if err := dec.Decode(&ss); errors.Is(err, io.EOF) {
			if n-1 != hdr.Count {
				return nil, fmt.Errorf("%d sessions, header says %d (truncated?)", n-1, hdr.Count)
			}
			return recs, nil
		} else if err != nil {
			return nil, fmt.Errorf("session %d: %w", n, err)
		}
		s, err := ss.session()
		if err != nil {
			return nil, fmt.Errorf("session %d (%q): %w", n, ss.ID, err)
		}
		if prev != nil && (prev.Service > s.Service || prev.Service == s.Service && prev.ID >= s.ID) {
			return nil, fmt.Errorf("session %d (%q): out of order or duplicate", n, s.ID)
		}
		prev = &s
		if s.Status == session.StatusActive && !now.Before(s.ExpiresAt()) {
			s.Status, s.Ended = session.StatusExpired, s.ExpiresAt()
		}
		if s.Status != session.StatusActive && !now.Before(s.Ended.Add(m.retention)) {
			continue // past retention: the reaper would purge it at once
		}
		if err := m.checkKind(s.Kind); err != nil {
			return nil, fmt.Errorf("session %d (%q): %w", n, s.ID, err)
		}
		recs = append(recs, m.newRecord(s, nil, nil))
	}
}

// session converts and validates a snapshot record.
func (ss snapshotSession) session() (session.Session, error) {
	s := session.Session{
		ID: ss.ID, Service: ss.Service, Instance: ss.Instance, Kind: ss.Kind,
		Created: ss.Created.UTC(), LastModified: ss.LastModified.UTC(), LastSeen: ss.LastSeen.UTC(),
		TTL: ss.TTL, IdleTimeout: ss.IdleTimeout, Status: ss.Status, DisableReuse: ss.DisableReuse,
		Ended: ss.Ended.UTC(), Attributes: session.CloneAttributes(ss.Attributes),
	}
	if err := session.CheckSession(s); err != nil {
		return session.Session{}, err
	}
	// The store keeps times as Unix nanoseconds.
	for _, t := range []struct {
		name string
		t    time.Time
		zero bool
	}{{"last seen", s.LastSeen, false}, {"last modified", s.LastModified, true}, {"ended", s.Ended, true}} {
		if t.zero && t.t.IsZero() {
			continue
		}
		if t.t.UnixNano() <= 0 || t.t.Year() >= 2262 {
			return session.Session{}, fmt.Errorf("%w: %s time %v out of range", session.ErrInvalid, t.name, t.t)
		}
	}
	switch {
	case s.Status == session.StatusActive && !s.Ended.IsZero():
		return session.Session{}, fmt.Errorf("%w: Active with an end time", session.ErrInvalid)
	case (s.Status == session.StatusExpired || s.Status == session.StatusTerminated) && s.Ended.IsZero():
		return session.Session{}, fmt.Errorf("%w: %s without an end time", session.ErrInvalid, s.Status)
	case s.Status != session.StatusActive && s.Status != session.StatusExpired && s.Status != session.StatusTerminated:
		return session.Session{}, fmt.Errorf("%w: unknown status %q", session.ErrInvalid, s.Status)
	}
	return s, nil
}

// MoveSnapshotAside renames an unreadable snapshot at path to path.corrupt-<UTC time> (a
// number is appended if that exists) so that the operator can inspect it, and returns the new
// name. It is the store.onCorruptSnapshot: moveAside policy; the caller logs it.
func MoveSnapshotAside(path string, now time.Time) (string, error) {
	base := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
	to := base
	for i := 1; ; i++ {
		if _, err := os.Lstat(to); errors.Is(err, fs.ErrNotExist) {
			break
		}
		to = fmt.Sprintf("%s.%d", base, i)
	}
	if err := os.Rename(path, to); err != nil {
		return "", fmt.Errorf("move snapshot aside: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return to, fmt.Errorf("move snapshot aside: %w", err)
	}
	return to, nil
}
