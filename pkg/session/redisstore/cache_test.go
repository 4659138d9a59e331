package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

// redisCommands counts the commands srv has run, the counting itself (INFO) and the client's
// connection keepalive (PING, sent on an idle connection) left out.
func redisCommands(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	n, err := srv.CommandTotal("ping")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func testSession(t *testing.T, inst string) session.Session {
	return session.Session{ID: sessiontest.RandomHex(t, 16), Service: "svc", Instance: inst, Kind: session.KindCookie,
		TTL: time.Hour, IdleTimeout: time.Hour}
}

// A session another replica made is served from the replica cache once read: Get and Touch
// send Redis nothing (the handles run no background loops here, so every command counted is
// one the calls sent). Changes and ends made elsewhere reach the cache by invalidation.
func TestRedisGetServedFromTrackedCache(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	open := func() *redisstore.Store {
		st, err := redisstore.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	a, b := open(), open()
	s := testSession(t, "i1")
	if err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(ctx, s.Service, s.ID); err != nil || got.Instance != "i1" {
		t.Fatalf("first Get = %+v, %v; want instance i1", got, err)
	}
	before := redisCommands(t, srv)
	for range 1000 {
		got, err := a.Get(ctx, s.Service, s.ID)
		if err != nil || got.Instance != "i1" {
			t.Fatalf("Get = %+v, %v; want instance i1", got, err)
		}
		a.Touch(ctx, s.Service, s.ID, time.Now())
	}
	if n := redisCommands(t, srv) - before; n != 0 {
		t.Errorf("1000 Gets and Touches of a tracked session sent %d Redis commands, want 0", n)
	}

	if _, err := b.Update(ctx, s.Service, s.ID, func(x *session.Session) error { x.Instance = "i2"; return nil }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the other replica's move reaches the cache", func() bool {
		got, err := a.Get(ctx, s.Service, s.ID)
		return err == nil && got.Instance == "i2"
	})
	if _, err := b.End(ctx, s.Service, s.ID, session.StatusTerminated, time.Now()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the other replica's end reaches the cache", func() bool {
		got, err := a.Get(ctx, s.Service, s.ID)
		return err == nil && got.Status == session.StatusTerminated
	})

	// This handle's own writes are seen by its next Get at once (no invalidation awaited),
	// though Redis tracks the key for it and rueidis still holds the older copy.
	for range 100 {
		own := testSession(t, "i1")
		if err := a.Create(ctx, own); err != nil {
			t.Fatal(err)
		}
		for range 2 { // read, then served from the cache: tracked
			if _, err := a.Get(ctx, own.Service, own.ID); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Update(ctx, own.Service, own.ID, func(x *session.Session) error { x.Instance = "i3"; return nil }); err != nil {
			t.Fatal(err)
		}
		if got, err := a.Get(ctx, own.Service, own.ID); err != nil || got.Instance != "i3" {
			t.Fatalf("Get after this handle's Update = %+v, %v; want instance i3", got, err)
		}
		if _, err := a.Get(ctx, own.Service, own.ID); err != nil { // tracked again
			t.Fatal(err)
		}
		if _, err := a.End(ctx, own.Service, own.ID, session.StatusTerminated, time.Now()); err != nil {
			t.Fatal(err)
		}
		if got, err := a.Get(ctx, own.Service, own.ID); err != nil || got.Status != session.StatusTerminated {
			t.Fatalf("Get after this handle's End = %+v, %v; want Terminated", got, err)
		}
	}
}

// A replica whose connection broke does not trust what it cached before: Redis restarted
// empty (no persistence), so the session is gone, and the cache must say so once Redis is
// back, instead of routing on the record it had vouched for.
func TestRedisCacheDistrustedAfterReconnect(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	st := newRedisStore(t, redisstore.Config{Addrs: []string{srv.Addr}})
	s := testSession(t, "i1")
	if err := st.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second read is served from the cache
		if _, err := st.Get(ctx, s.Service, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	srv.Restart()
	testutil.Eventually(t, "the session lost with Redis's data is reported gone", func() bool {
		_, err := st.Get(ctx, s.Service, s.ID)
		return errors.Is(err, session.ErrNotFound)
	})
}

// A session this handle placed is one it knows: if Redis hangs (SIGSTOP) before anything
// read the session back, the handle still routes it from its cache, as it does a session it
// created or read (degraded mode). A session only another handle has written is unknown to it:
// unavailable, neither served nor reported gone.
func TestRedisPlacedSessionRoutesWhileRedisHangs(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	open := func() *redisstore.Store {
		st, err := redisstore.New(cfg, redisstore.WithOpTimeout(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	a, b := open(), open()
	created := testSession(t, "i1")
	if err := a.Create(ctx, created); err != nil {
		t.Fatal(err)
	}
	placed := testSession(t, "")
	inst, _, err := a.PlaceCreate(ctx, placed, []session.PlaceCandidate{{Instance: "i1", Cap: 10}, {Instance: "i2", Cap: 10}})
	if err != nil {
		t.Fatal(err)
	}
	unseen := testSession(t, "i2")
	if err := b.Create(ctx, unseen); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	t.Cleanup(srv.Resume)
	for _, c := range []struct {
		name, id, inst string
	}{{"placed", placed.ID, inst}, {"created", created.ID, "i1"}} {
		got, err := a.Get(ctx, "svc", c.id)
		if err != nil || got.Instance != c.inst || got.Status != session.StatusActive {
			t.Errorf("Get of a session this handle %s, Redis hung: %+v, %v; want Active on %s", c.name, got, err, c.inst)
		}
	}
	if _, err := a.Get(ctx, "svc", unseen.ID); !errors.Is(err, session.ErrStoreUnavailable) {
		t.Errorf("Get of a session only another handle wrote, Redis hung: %v; want ErrStoreUnavailable", err)
	}
}

// A session this handle moved (PlaceMove, a rebind) is known where it now is: if Redis hangs
// (SIGSTOP) before the session is read again, the handle routes it to the instance it was moved
// to, with the record exactly as written — not the record it read before the move, which names
// the instance the session left (often one that can no longer serve it). Both a session the
// handle placed itself and one it only read (another handle created it) are moved.
func TestRedisMovedSessionRoutesWhileRedisHangs(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	open := func() *redisstore.Store {
		st, err := redisstore.New(cfg, redisstore.WithOpTimeout(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	a, b := open(), open()
	from := []session.PlaceCandidate{{Instance: "i1", Cap: 10}}
	to := []session.PlaceCandidate{{Instance: "i2", Cap: 10}}
	placed := testSession(t, "")
	if _, _, err := a.PlaceCreate(ctx, placed, from); err != nil {
		t.Fatal(err)
	}
	other := testSession(t, "")
	if _, _, err := b.PlaceCreate(ctx, other, from); err != nil {
		t.Fatal(err)
	}
	ids := []string{placed.ID, other.ID}
	for _, id := range ids {
		if got, err := a.Get(ctx, "svc", id); err != nil || got.Instance != "i1" { // a reads it: cached, tracked
			t.Fatalf("Get before the move: %+v, %v; want it on i1", got, err)
		}
		if inst, err := a.PlaceMove(ctx, "svc", id, "i1", to); err != nil || inst != "i2" {
			t.Fatalf("PlaceMove = %q, %v; want i2", inst, err)
		}
	}
	srv.Pause()
	hung := map[string]session.Session{}
	for _, id := range ids {
		got, err := a.Get(ctx, "svc", id)
		if err != nil || got.Instance != "i2" || got.Status != session.StatusActive {
			t.Errorf("Get of a session this handle moved to i2, Redis hung: %+v, %v; want Active on i2", got, err)
		}
		hung[id] = got
	}
	srv.Resume()
	for _, id := range ids {
		var got session.Session
		testutil.Eventually(t, "Redis answers again", func() bool {
			var err error
			got, err = b.Get(ctx, "svc", id)
			return err == nil
		})
		if diff := cmp.Diff(got, hung[id]); diff != "" {
			t.Errorf("the record served while Redis hung differs from what Redis holds (-redis +served):\n%s", diff)
		}
	}
}
