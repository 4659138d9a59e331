package memstore_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// snapHeader and snapSession mirror the documented gob snapshot format. They are declared here
// independently of the store (gob matches fields by name), so the tests also pin the format.
type snapHeader struct {
	Format  string
	Version int
	SavedAt time.Time
	Count   int
}

type snapSession struct {
	ID, Service, Instance           string
	Kind                            session.Kind
	Created, LastModified, LastSeen time.Time
	TTL, IdleTimeout                time.Duration
	Status                          session.Status
	DisableReuse                    bool
	Ended                           time.Time
	Attributes                      map[string]string
}

func toSnap(s session.Session) snapSession {
	return snapSession{
		ID: s.ID, Service: s.Service, Instance: s.Instance, Kind: s.Kind,
		Created: s.Created, LastModified: s.LastModified, LastSeen: s.LastSeen,
		TTL: s.TTL, IdleTimeout: s.IdleTimeout, Status: s.Status, DisableReuse: s.DisableReuse,
		Ended: s.Ended, Attributes: s.Attributes,
	}
}

// encodeSnapshot returns a snapshot stream of hdr followed by recs.
func encodeSnapshot(t testing.TB, hdr snapHeader, recs []snapSession) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := gob.NewEncoder(&buf)
	if err := enc.Encode(hdr); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// writeSnapshotFile writes sessions as a version 1 snapshot.
func writeSnapshotFile(t testing.TB, path string, savedAt time.Time, ss []session.Session) {
	t.Helper()
	recs := make([]snapSession, 0, len(ss))
	for _, s := range ss {
		recs = append(recs, toSnap(s))
	}
	hdr := snapHeader{Format: "tether-sessions", Version: 1, SavedAt: savedAt, Count: len(ss)}
	if err := os.WriteFile(path, encodeSnapshot(t, hdr, recs), 0o600); err != nil {
		t.Fatal(err)
	}
}

// bigStore returns a store holding n sessions of several services, statuses and shapes, built
// through RestoreSnapshot (one transaction: 100k single Creates are too slow under -race) and
// then changed through the public API so that hot state (touches) is part of it.
func bigStore(t testing.TB, n int, opts ...memstore.Option) (*memstore.Store, *testutil.Clock) {
	t.Helper()
	st, clock := sessiontest.NewMemStore(t, opts...)
	t0 := clock.Now()
	ss := make([]session.Session, 0, n)
	for i := range n {
		s := sessiontest.Session(fmt.Sprint("svc", i%4), fmt.Sprintf("%032x", i), fmt.Sprint("inst", i%50))
		s.Created = t0.Add(-time.Duration(i%3600) * time.Second)
		s.LastModified, s.LastSeen, s.Status = s.Created, t0, session.StatusActive
		s.Kind = []session.Kind{session.KindCookie, session.KindHeader, session.KindMCPStreamable, session.KindMCPSSE}[i%4]
		s.DisableReuse = i%7 == 0
		if i%10 == 0 {
			s.Attributes = map[string]string{"user": strconv.Itoa(i), "tenant": "t" + strconv.Itoa(i%3)}
		}
		switch i % 20 {
		case 0:
			s.Status, s.Ended = session.StatusTerminated, t0
		case 1:
			s.LastSeen, s.IdleTimeout = s.Created, time.Minute // lapsed: restored as Expired
		}
		ss = append(ss, s)
	}
	slices.SortFunc(ss, func(a, b session.Session) int {
		return cmp.Or(strings.Compare(a.Service, b.Service), strings.Compare(a.ID, b.ID))
	})
	path := filepath.Join(t.TempDir(), "seed.snap")
	writeSnapshotFile(t, path, t0, ss)
	if got, err := st.RestoreSnapshot(path); err != nil || got != n {
		t.Fatalf("seed restore = %d, %v; want %d", got, err, n)
	}
	// Touch a tenth of the live sessions, so hot last-seen times must survive the round trip.
	now := clock.Advance(time.Second)
	for i := 2; i < n; i += 10 {
		st.Touch(context.Background(), fmt.Sprint("svc", i%4), fmt.Sprintf("%032x", i), now)
	}
	return st, clock
}

// TestSnapshotRoundTrip100k saves 100k sessions, restores them into a new store a second
// later and checks that nothing changed: every Active session is still Active on the same
// instance with the same LastSeen (touches included), ended ones keep their status.
//
// The round trip is single-goroutine code, so the race detector learns nothing more from 100k
// sessions than from 25k while costing ~5x: under -race it runs 25k, under -short 10k.
func TestSnapshotRoundTrip100k(t *testing.T) {
	n := 100_000
	switch {
	case testing.Short():
		n = 10_000
	case raceEnabled:
		n = 25_000
	}
	ctx := t.Context()
	st, clock := bigStore(t, n)
	before := sessiontest.Dump(t, st, session.Filter{}, session.MaxListLimit)
	if len(before) != n {
		t.Fatalf("store holds %d sessions, want %d", len(before), n)
	}
	path := filepath.Join(t.TempDir(), "sessions.snap")
	start := time.Now()
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	saved := time.Since(start)

	clock.Advance(time.Second) // the restart
	rec := newOnEndRecorder()
	restored := memstore.New(memstore.WithClock(clock.Now), memstore.WithOnEnd(rec.record))
	start = time.Now()
	got, err := restored.RestoreSnapshot(path)
	if err != nil || got != n {
		t.Fatalf("RestoreSnapshot = %d, %v; want %d", got, err, n)
	}
	t.Logf("%d sessions: save %v, restore %v", n, saved, time.Since(start))

	after := sessiontest.Dump(t, restored, session.Filter{}, session.MaxListLimit)
	if len(after) != len(before) {
		t.Fatalf("%d sessions after restore, want %d", len(after), len(before))
	}
	for i := range before {
		if !reflect.DeepEqual(before[i], after[i]) { // fast path; cmp decides
			Diff(t, fmt.Sprintf("session %d after restore", i), before[i], after[i])
		}
	}
	active := 0
	for _, s := range before {
		if s.Status != session.StatusActive {
			continue
		}
		active++
		g, err := restored.Get(ctx, s.Service, s.ID)
		if err != nil || g.Status != session.StatusActive || g.Instance != s.Instance {
			t.Fatalf("%s/%s after restart: %+v, %v; want Active on %s", s.Service, s.ID, g, err, s.Instance)
		}
	}
	if active < n*8/10 {
		t.Fatalf("only %d of %d sessions were Active: the fixture is wrong", active, n)
	}
	// Hot state is rebuilt: a restored session can be kept alive by touches.
	live := before[len(before)-1]
	for range 3 {
		restored.Touch(context.Background(), live.Service, live.ID, clock.Advance(20*time.Minute))
	}
	Diff(t, "restored session touched past its idle deadline", session.StatusActive, sessiontest.MustGet(t, restored, live.Service, live.ID).Status)
	Diff(t, "OnEnd calls during restore", 0, rec.total())
}

func TestRestoreExpiresWhatLapsedMeanwhile(t *testing.T) {
	ctx := t.Context()
	st, clock := sessiontest.NewMemStore(t)
	t0 := clock.Now()
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "idle", "a")) // idle 30m
	long := sessiontest.Session("web", "long", "a")
	long.IdleTimeout = time.Hour
	sessiontest.MustCreate(t, st, long)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "touched", "b"))
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "gone", "b"))
	if _, err := st.End(ctx, "web", "gone", session.StatusTerminated, t0); err != nil {
		t.Fatal(err)
	}
	st.Touch(context.Background(), "web", "touched", t0.Add(20*time.Minute))
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}

	restore := func(at time.Time) (*memstore.Store, *onEndRecorder, int) {
		rec := newOnEndRecorder()
		m := memstore.New(memstore.WithClock(func() time.Time { return at }), memstore.WithOnEnd(rec.record))
		n, err := m.RestoreSnapshot(path)
		if err != nil {
			t.Fatal(err)
		}
		return m, rec, n
	}

	m, rec, n := restore(t0.Add(40 * time.Minute)) // down for 40 minutes
	Diff(t, "restored records", 4, n)
	statuses := map[string]session.Status{}
	for _, s := range sessiontest.Dump(t, m, session.Filter{}, 0) {
		statuses[s.ID] = s.Status
	}
	Diff(t, "statuses", map[string]session.Status{
		"gone": session.StatusTerminated, "idle": session.StatusExpired,
		"long": session.StatusActive, "touched": session.StatusActive,
	}, statuses)
	Diff(t, "idle ended at its expiry", t0.Add(30*time.Minute), sessiontest.MustGet(t, m, "web", "idle").Ended)
	a, _ := m.ActiveByInstance(ctx, "web", "a")
	b, _ := m.ActiveByInstance(ctx, "web", "b")
	Diff(t, "active after restore (what the engine recounts)", []string{"long", "touched"}, []string{a[0].ID, b[0].ID})
	Diff(t, "active counts", []int{1, 1}, []int{len(a), len(b)})
	if ended, _, _ := m.Reap(ctx); ended != 0 {
		t.Errorf("Reap after restore ended %d sessions, want 0", ended)
	}
	Diff(t, "OnEnd calls", 0, rec.total())

	// Down for a day: "gone" ended at t0 and is dropped; the others lapsed 30-60 minutes after
	// t0 (their Ended), so they are still within the retention.
	m, _, n = restore(t0.Add(session.DefaultRetention + 10*time.Minute))
	Diff(t, "records within retention", 3, n)
	if _, err := m.Get(ctx, "web", "gone"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("record past retention: %v, want ErrNotFound", err)
	}
	for _, id := range []string{"idle", "long", "touched"} {
		Diff(t, id+" status", session.StatusExpired, sessiontest.MustGet(t, m, "web", id).Status)
	}
}

func TestRestoreMissingFileIsEmpty(t *testing.T) {
	st, _ := sessiontest.NewMemStore(t)
	n, err := st.RestoreSnapshot(filepath.Join(t.TempDir(), "none.snap"))
	if n != 0 || err != nil {
		t.Fatalf("RestoreSnapshot(missing) = %d, %v; want 0, nil", n, err)
	}
}

func TestRestoreRefusesBadFilesAndChangesNothing(t *testing.T) {
	t0 := sessiontest.Start()
	hdr := func(count int) snapHeader {
		return snapHeader{Format: "tether-sessions", Version: 1, SavedAt: t0, Count: count}
	}
	rec := func(id string, f ...func(*snapSession)) snapSession {
		s := sessiontest.Session("web", id, "a")
		s.Created, s.LastModified, s.LastSeen, s.Status = t0, t0, t0, session.StatusActive
		r := toSnap(s)
		for _, f := range f {
			f(&r)
		}
		return r
	}
	good := encodeSnapshot(t, hdr(2), []snapSession{rec("a"), rec("b")})
	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"empty file", nil},
		{"not gob", []byte("{\"format\":\"tether-sessions\"}\n")},
		{"other format", encodeSnapshot(t, snapHeader{Format: "x", Version: 1}, nil)},
		{"future version", encodeSnapshot(t, snapHeader{Format: "tether-sessions", Version: 2}, nil)},
		{"negative count", encodeSnapshot(t, hdr(-1), nil)},
		{"truncated at a record boundary", encodeSnapshot(t, hdr(3), []snapSession{rec("a"), rec("b")})},
		{"cut mid-record", good[:len(good)-10]},
		{"extra record", encodeSnapshot(t, hdr(1), []snapSession{rec("a"), rec("b")})},
		{"duplicate", encodeSnapshot(t, hdr(2), []snapSession{rec("a"), rec("a")})},
		{"out of order", encodeSnapshot(t, hdr(2), []snapSession{rec("b"), rec("a")})},
		{"empty id", encodeSnapshot(t, hdr(1), []snapSession{rec("")})},
		{"zero TTL", encodeSnapshot(t, hdr(1), []snapSession{rec("a", func(r *snapSession) { r.TTL = 0 })})},
		{"unknown status", encodeSnapshot(t, hdr(1), []snapSession{rec("a", func(r *snapSession) {
			r.Status, r.Ended = "Zombie", t0
		})})},
		{"terminated without end", encodeSnapshot(t, hdr(1), []snapSession{rec("a", func(r *snapSession) {
			r.Status = session.StatusTerminated
		})})},
		{"active with an end", encodeSnapshot(t, hdr(1), []snapSession{rec("a", func(r *snapSession) { r.Ended = t0 })})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.snap")
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			st, _ := sessiontest.NewMemStore(t)
			if n, err := st.RestoreSnapshot(path); err == nil {
				t.Fatalf("RestoreSnapshot = %d, nil; want an error", n)
			}
			if got := sessiontest.Dump(t, st, session.Filter{}, 0); len(got) != 0 {
				t.Errorf("a failed restore left %d sessions", len(got))
			}
		})
	}
	t.Run("good file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "s.snap")
		if err := os.WriteFile(path, good, 0o600); err != nil {
			t.Fatal(err)
		}
		st, _ := sessiontest.NewMemStore(t)
		if n, err := st.RestoreSnapshot(path); n != 2 || err != nil {
			t.Fatalf("RestoreSnapshot = %d, %v; want 2, nil", n, err)
		}
		t.Run("into a non-empty store", func(t *testing.T) {
			before := sessiontest.Dump(t, st, session.Filter{}, 0)
			if n, err := st.RestoreSnapshot(path); err == nil {
				t.Fatalf("second RestoreSnapshot = %d, nil; want an error", n)
			}
			Diff(t, "store after refused restore", before, sessiontest.Dump(t, st, session.Filter{}, 0))
		})
	})
}

// TestSnapshotKeepsIDsByteExact: header-mode ids are chosen by clients and may hold any bytes
// but NUL; a restart must not change them.
func TestSnapshotKeepsIDsByteExact(t *testing.T) {
	st, clock := sessiontest.NewMemStore(t)
	ids := []string{"plain", "caf\xc3\xa9", "bad-utf8-\xff\xfe", "quote\"and\\slash", "ctl\x01\x1f", "<html>&"}
	for _, id := range ids {
		s := sessiontest.Session("web", id, "a")
		s.Attributes = map[string]string{"k\xff": "v\x00"}
		sessiontest.MustCreate(t, st, s)
	}
	path := filepath.Join(t.TempDir(), "s.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	m := memstore.New(memstore.WithClock(clock.Now))
	if _, err := m.RestoreSnapshot(path); err != nil {
		t.Fatal(err)
	}
	Diff(t, "sessions", sessiontest.Dump(t, st, session.Filter{}, 0), sessiontest.Dump(t, m, session.Filter{}, 0))
	for _, id := range ids {
		sessiontest.MustGet(t, m, "web", id)
	}
}

// TestSnapshotFailedWriteLeavesOldFile makes the write of path.tmp fail with ENOSPC (the
// temporary file is a symlink to /dev/full) and checks that the old snapshot, the directory
// and the store are untouched.
func TestSnapshotFailedWriteLeavesOldFile(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	st, clock := sessiontest.NewMemStore(t)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "a"))
	dir := t.TempDir()
	path := filepath.Join(dir, "sessions.snap")
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		sessiontest.MustCreate(t, st, sessiontest.Session("web", fmt.Sprintf("n%05d", i), "a"))
	}
	clock.Advance(time.Second)
	before := sessiontest.Dump(t, st, session.Filter{}, session.MaxListLimit)
	if err := os.Symlink("/dev/full", path+".tmp"); err != nil {
		t.Fatal(err)
	}

	if err := st.SaveSnapshot(path); err == nil {
		t.Fatal("SaveSnapshot onto a full device succeeded")
	}
	now, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(old, now) {
		t.Fatalf("old snapshot changed by a failed save (err %v)", err)
	}
	if _, err := os.Lstat(path + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary file left behind: %v", err)
	}
	Diff(t, "store after a failed save", before, sessiontest.Dump(t, st, session.Filter{}, session.MaxListLimit))
	if err := st.SaveSnapshot(filepath.Join(dir, "no-such-dir", "s.snap")); err == nil {
		t.Error("SaveSnapshot into a missing directory succeeded")
	}
	// The next save succeeds and replaces the file.
	if err := st.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	m := memstore.New(memstore.WithClock(clock.Now))
	if n, err := m.RestoreSnapshot(path); n != 101 || err != nil {
		t.Fatalf("restore after a good save = %d, %v; want 101", n, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}

const (
	crashEnv      = "TETHER_SESSION_CRASH_SNAPSHOT"
	crashSessions = 20_000
)

// TestSnapshotCrashHelper is the child of TestSnapshotCrashMidWriteLeavesOldFile: it saves
// snapshots of a large store in a loop until it is killed.
func TestSnapshotCrashHelper(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("helper process only")
	}
	st, _ := bigStore(t, crashSessions)
	fmt.Println("ready") // the parent kills at random moments from now on
	for {
		if err := st.SaveSnapshot(path); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSnapshotCrashMidWriteLeavesOldFile kills (SIGKILL) a process that keeps saving
// snapshots at random moments: afterwards the file at path is always a complete snapshot,
// either the old one or a new one, never a torn one.
func TestSnapshotCrashMidWriteLeavesOldFile(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "sessions.snap")
	oldStore, clock := sessiontest.NewMemStore(t)
	for i := range 10 {
		sessiontest.MustCreate(t, oldStore, sessiontest.Session("web", fmt.Sprint("old", i), "a"))
	}
	if err := oldStore.SaveSnapshot(path); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tornTmp := 0
	for round := range 6 {
		if round >= 3 && tornTmp > 0 {
			break
		}
		cmd := exec.Command(exe, "-test.run=^TestSnapshotCrashHelper$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "ready" {
					ready <- true
					break
				}
			}
			_, _ = io.Copy(io.Discard, out)
		}()
		select {
		case <-ready:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			t.Fatal("the child never got ready")
		}
		// The child saves in a loop. Kill it the moment a temporary file with content shows
		// up (a save caught between its write and its rename), or after a random delay if
		// polling never sees one.
		deadline := time.Now().Add(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		for time.Now().Before(deadline) {
			if fi, err := os.Stat(path + ".tmp"); err == nil && fi.Size() > 0 {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		torn := false
		if fi, err := os.Stat(path + ".tmp"); err == nil && fi.Size() > 0 {
			torn = true
			tornTmp++
		}
		m := memstore.New(memstore.WithClock(clock.Now))
		n, err := m.RestoreSnapshot(path)
		if err != nil || (n != 10 && n != crashSessions) {
			t.Fatalf("round %d: after a crash RestoreSnapshot = %d, %v; want the old (10) or a complete new (%d) snapshot",
				round, n, err, crashSessions)
		}
		t.Logf("round %d: killed mid-write: %v; the file holds %d sessions", round, torn, n)
	}
	if tornTmp == 0 {
		t.Fatal("no kill landed mid-write: the test proved nothing")
	}
}

func TestRunSnapshotsPeriodicallyAndAtShutdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.snap")
	st, clock := sessiontest.NewMemStore(t, memstore.WithSnapshot(path, 10*time.Millisecond))
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "a"))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	count := func() int {
		m := memstore.New(memstore.WithClock(clock.Now))
		n, err := m.RestoreSnapshot(path)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	testutil.Eventually(t, "a periodic snapshot", func() bool { return count() == 1 })
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s2", "a"))
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	Diff(t, "sessions in the final snapshot", 2, count())
}
