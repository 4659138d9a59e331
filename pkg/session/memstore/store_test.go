package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

func TestMemStoreConformance(t *testing.T) {
	sessiontest.RunConformance(t, func(t *testing.T, clock *testutil.Clock) session.Store {
		return memstore.New(memstore.WithClock(clock.Now))
	})
}

// onEndRecorder counts OnEnd calls per session.
type onEndRecorder struct {
	mu    sync.Mutex
	calls map[string][]session.Session
}

func newOnEndRecorder() *onEndRecorder {
	return &onEndRecorder{calls: map[string][]session.Session{}}
}

func (r *onEndRecorder) record(s session.Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[s.Service+"/"+s.ID] = append(r.calls[s.Service+"/"+s.ID], s)
}

func (r *onEndRecorder) get(key string) []session.Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]session.Session(nil), r.calls[key]...)
}

func (r *onEndRecorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += len(c)
	}
	return n
}

func TestReapEndsLapsedSessionsAndPurgesOldRecords(t *testing.T) {
	ctx := t.Context()
	rec := newOnEndRecorder()
	st, clock := sessiontest.NewMemStore(t, memstore.WithOnEnd(rec.record), memstore.WithRetention(time.Hour))
	t0 := clock.Now()
	ttl := sessiontest.Session("web", "ttl", "a")
	ttl.TTL, ttl.IdleTimeout = 10*time.Minute, 0
	sessiontest.MustCreate(t, st, ttl)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "idle", "a")) // idle 30m
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "busy", "a"))
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "gone", "b"))
	if _, err := st.End(ctx, "web", "gone", session.StatusTerminated, t0); err != nil {
		t.Fatal(err)
	}

	reap := func(wantEnded, wantPurged int) {
		t.Helper()
		ended, purged, err := st.Reap(ctx)
		if err != nil || ended != wantEnded || purged != wantPurged {
			t.Fatalf("Reap at +%v = %d ended, %d purged, %v; want %d, %d, nil",
				clock.Now().Sub(t0), ended, purged, err, wantEnded, wantPurged)
		}
	}
	reap(0, 0)
	clock.Advance(10 * time.Minute)
	reap(1, 0)
	Diff(t, "OnEnd of ttl", []session.Session{sessiontest.MustGet(t, st, "web", "ttl")}, rec.get("web/ttl"))
	Diff(t, "ttl status", session.StatusExpired, rec.get("web/ttl")[0].Status)
	Diff(t, "ttl ended", t0.Add(10*time.Minute), rec.get("web/ttl")[0].Ended)

	st.Touch(context.Background(), "web", "busy", clock.Advance(15*time.Minute)) // +25m
	clock.Advance(10 * time.Minute)                                              // +35m: idle lapsed, busy alive (seen at +25m)
	reap(1, 0)
	Diff(t, "idle OnEnd", 1, len(rec.get("web/idle")))
	Diff(t, "idle ended", t0.Add(30*time.Minute), rec.get("web/idle")[0].Ended)
	Diff(t, "busy status", session.StatusActive, sessiontest.MustGet(t, st, "web", "busy").Status)
	reap(0, 0) // busy's indexed expiry was rewritten: nothing is due any more

	clock.Set(t0.Add(time.Hour)) // "gone" ended at t0: retention 1h is over
	reap(1, 1)                   // busy lapses at +55m; gone is purged
	Diff(t, "busy ended", t0.Add(55*time.Minute), rec.get("web/busy")[0].Ended)
	if _, err := st.Get(ctx, "web", "gone"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("purged record: Get error %v, want ErrNotFound", err)
	}
	Diff(t, "terminated OnEnd", 1, len(rec.get("web/gone")))
	Diff(t, "total OnEnd", 4, rec.total())
	if got, _ := st.ActiveByInstance(ctx, "web", "a"); len(got) != 0 {
		t.Errorf("ActiveByInstance after reaping: %d sessions", len(got))
	}
	clock.Set(t0.Add(2 * time.Hour))
	reap(0, 3)
	if got := sessiontest.Dump(t, st, session.Filter{}, 0); len(got) != 0 {
		t.Errorf("records after retention: %d", len(got))
	}
}

func TestCreateOverLapsedSessionAnnouncesItsEnd(t *testing.T) {
	rec := newOnEndRecorder()
	st, clock := sessiontest.NewMemStore(t, memstore.WithOnEnd(rec.record))
	t0 := clock.Now()
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "a"))
	clock.Advance(time.Hour)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "b"))
	got := rec.get("web/s1")
	if len(got) != 1 {
		t.Fatalf("OnEnd calls: %d, want 1", len(got))
	}
	Diff(t, "ended instance", "a", got[0].Instance)
	Diff(t, "ended at", t0.Add(30*time.Minute), got[0].Ended)
	if ended, _, _ := st.Reap(t.Context()); ended != 0 {
		t.Errorf("Reap ended %d sessions after the replace, want 0", ended)
	}
	Diff(t, "OnEnd calls after Reap", 1, rec.total())
}

// TestOnEndExactlyOnceUnderConcurrency races End, Touch, Create and the reaper (Run) over the
// same sessions while the clock moves, and checks that every session life (one Create) is
// announced through OnEnd exactly once, with the status and time the store recorded.
func TestOnEndExactlyOnceUnderConcurrency(t *testing.T) {
	const n = 2000
	rec := newOnEndRecorder()
	st, clock := sessiontest.NewMemStore(t,
		memstore.WithOnEnd(rec.record), memstore.WithReapInterval(100*time.Microsecond))
	ctx, cancel := context.WithCancel(t.Context())
	runDone := make(chan error, 1)
	go func() { runDone <- st.Run(ctx) }()

	// Every successful Create gets a unique "life" attribute; each life must end exactly once.
	var createdMu sync.Mutex
	created := map[string]bool{}
	create := func(id, instance string, idle time.Duration) error {
		createdMu.Lock()
		defer createdMu.Unlock() // serialises creates: ends, touches and the reaper still race them
		life := fmt.Sprint(len(created) + 1)
		s := sessiontest.Session("web", id, instance)
		s.IdleTimeout = idle
		s.Attributes = map[string]string{"life": life}
		if err := st.Create(ctx, s); err != nil {
			return err
		}
		created[life] = true
		return nil
	}
	for i := range n {
		if err := create(fmt.Sprintf("s%04d", i), "a", time.Duration(5+i%60)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var ends atomic.Int64 // successful End calls
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // the clock: 60 s in 10 ms steps
		for range 6000 {
			clock.Advance(10 * time.Millisecond)
			if rand.IntN(64) == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		close(stop)
	})
	for w := range 4 {
		wg.Go(func() { // enders: End a random session, sometimes create it again
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("s%04d", r.IntN(n))
				if _, err := st.End(ctx, "web", id, session.StatusTerminated, clock.Now()); err == nil {
					ends.Add(1)
				} else if !errors.Is(err, session.ErrEnded) {
					t.Errorf("End(%s): %v", id, err)
					return
				}
				if r.IntN(2) == 0 {
					if err := create(id, "b", time.Second); err != nil && !errors.Is(err, session.ErrExists) {
						t.Errorf("Create(%s): %v", id, err)
						return
					}
				}
			}
		})
	}
	for w := range 4 {
		wg.Go(func() { // touchers
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				st.Touch(context.Background(), "web", fmt.Sprintf("s%04d", r.IntN(n)), clock.Now())
			}
		})
	}
	wg.Wait()
	clock.Advance(7 * time.Hour) // everything lapses
	testutil.Eventually(t, "reaper ends every session", func() bool {
		a, _ := st.ActiveByInstance(ctx, "web", "a")
		b, _ := st.ActiveByInstance(ctx, "web", "b")
		return len(a)+len(b) == 0
	})
	cancel()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}

	announced := map[string]int{}
	var terminated int64
	for i := range n {
		key := fmt.Sprintf("web/s%04d", i)
		calls := rec.get(key)
		if len(calls) == 0 {
			t.Fatalf("%s: no OnEnd", key)
		}
		for _, c := range calls {
			announced[c.Attributes["life"]]++
			if c.Status == session.StatusTerminated {
				terminated++
			}
			if c.Status != session.StatusTerminated && !c.Ended.Equal(c.ExpiresAt()) {
				t.Errorf("%s: Expired at %v, but ExpiresAt is %v", key, c.Ended, c.ExpiresAt())
			}
		}
		last := sessiontest.MustGet(t, st, "web", fmt.Sprintf("s%04d", i))
		Diff(t, key+" last OnEnd vs stored record", last, calls[len(calls)-1])
	}
	for life := range created {
		if announced[life] != 1 {
			t.Errorf("life %s announced %d times, want 1", life, announced[life])
		}
	}
	Diff(t, "announced lives", len(created), len(announced))
	Diff(t, "Terminated announcements vs successful Ends", ends.Load(), terminated)
	t.Logf("%d lives, %d ended by End, %d by expiry", len(created), terminated, int64(len(created))-terminated)
}

// TestTouchRacingReaperNeverLosesASession keeps one session alive only by touches while the
// reaper runs flat out and the clock races through dozens of idle periods.
func TestTouchRacingReaperNeverLosesASession(t *testing.T) {
	rec := newOnEndRecorder()
	st, clock := sessiontest.NewMemStore(t, memstore.WithOnEnd(rec.record), memstore.WithReapInterval(100*time.Microsecond))
	s := sessiontest.Session("web", "kept", "a")
	s.IdleTimeout = time.Second
	sessiontest.MustCreate(t, st, s)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "other", "a"))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = st.Run(ctx) }()
	for i := range 20000 { // 20000 × 100 ms = 2000 s = 2000 idle timeouts
		now := clock.Advance(100 * time.Millisecond)
		st.Touch(context.Background(), "web", "kept", now)
		if i%1000 == 0 {
			if got := sessiontest.MustGet(t, st, "web", "kept"); got.Status != session.StatusActive {
				t.Fatalf("step %d: kept session is %s", i, got.Status)
			}
		}
	}
	testutil.Eventually(t, "the untouched session is reaped", func() bool { return len(rec.get("web/other")) == 1 })
	if got := rec.get("web/kept"); len(got) != 0 {
		t.Fatalf("touched session was ended: %+v", got)
	}
	Diff(t, "kept LastSeen", clock.Now(), sessiontest.MustGet(t, st, "web", "kept").LastSeen)
}

func TestTouchDoesNotAllocate(t *testing.T) {
	st, clock := sessiontest.NewMemStore(t)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "a"))
	now := clock.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		st.Touch(context.Background(), "web", "s1", now)
		st.Touch(context.Background(), "web", "unknown", now)
	})
	if allocs != 0 {
		t.Errorf("Touch allocates %.1f times per call, want 0", allocs)
	}
	Diff(t, "LastSeen", now, sessiontest.MustGet(t, st, "web", "s1").LastSeen)
}

// TestReadsAndTouchDoNotWaitForWriters holds memdb's single write lock (inside an Update) and
// checks that Touch, Get, List and ActiveByInstance still complete.
func TestReadsAndTouchDoNotWaitForWriters(t *testing.T) {
	ctx := t.Context()
	st, clock := sessiontest.NewMemStore(t)
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s1", "a"))
	sessiontest.MustCreate(t, st, sessiontest.Session("web", "s2", "a"))
	inWriter, release := make(chan struct{}), make(chan struct{})
	updated := make(chan error, 1)
	go func() {
		_, err := st.Update(ctx, "web", "s2", func(*session.Session) error {
			close(inWriter)
			<-release
			return nil
		})
		updated <- err
	}()
	<-inWriter
	readersDone := make(chan struct{})
	touched := clock.Advance(time.Minute)
	go func() {
		defer close(readersDone)
		st.Touch(context.Background(), "web", "s1", touched)
		sessiontest.MustGet(t, st, "web", "s1")
		sessiontest.Dump(t, st, session.Filter{}, 0)
		if _, err := st.ActiveByInstance(ctx, "web", "a"); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-readersDone:
	case <-time.After(10 * time.Second):
		t.Fatal("readers blocked behind a writer")
	}
	close(release)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	Diff(t, "LastSeen", touched, sessiontest.MustGet(t, st, "web", "s1").LastSeen)
}

func TestCreateConcurrentSameIDOnlyOneWins(t *testing.T) {
	st, _ := sessiontest.NewMemStore(t)
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			err := st.Create(t.Context(), sessiontest.Session("web", "s1", fmt.Sprint("i", i)))
			switch {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, session.ErrExists):
				t.Errorf("Create: %v", err)
			}
		})
	}
	wg.Wait()
	Diff(t, "successful creates", int32(1), wins.Load())
}

func TestRunIsExclusive(t *testing.T) {
	st, _ := sessiontest.NewMemStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- st.Run(ctx) }()
	}
	if err := <-done; err == nil { // the loser returns at once, the winner only after cancel
		t.Fatal("two concurrent Runs: the first to return returned nil, want an error")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id, err := session.NewID()
		if err != nil {
			t.Fatal(err)
		}
		if !session.IsGeneratedID(id) {
			t.Fatalf("NewID() = %q: not 32 lower-case hex characters", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "0123456789abcdef0123456789ABCDEF", "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdeg"} {
		if session.IsGeneratedID(bad) {
			t.Errorf("IsGeneratedID(%q) = true", bad)
		}
	}
}

// Diff is sessiontest.Diff, short.
func Diff(t testing.TB, what string, want, got any) {
	t.Helper()
	sessiontest.Diff(t, what, want, got)
}
