package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/redisstore"
	"github.com/tether-dev/tether/pkg/session/sessiontest"
)

func durableSession(id string) session.Session {
	return session.Session{ID: id, Service: "fn", Instance: "i1", Kind: session.KindCookie, TTL: time.Hour}
}

// notDurable reports whether err is the store's "written but not acknowledged durably" error,
// which a client sees as 503 StoreUnavailable.
func notDurable(err error) bool {
	return errors.Is(err, redisstore.ErrNotDurable) && errors.Is(err, session.ErrStoreUnavailable)
}

// TestAckAOFNeedsAppendfsyncAlways: with ackDurability aof the store refuses a Redis without
// appendonly yes and appendfsync always when it starts, and checks the policy again on the
// connection of each acknowledged write: after CONFIG SET appendfsync everysec a create is not
// acknowledged (503) and is ended again, and once the policy is back creates are.
func TestAckAOFNeedsAppendfsyncAlways(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF("always"))
	aof := redisstore.WithDurability(redisstore.Durability{Mode: redisstore.AckAOF})
	cfg := redisstore.Config{Addrs: []string{srv.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	st := newRedisStore(t, cfg, aof)
	ctx := context.Background()
	if err := st.Create(ctx, durableSession("a")); err != nil {
		t.Fatalf("create with appendfsync always: %v", err)
	}

	if _, err := srv.Do("CONFIG", "SET", "appendfsync", "everysec"); err != nil {
		t.Fatal(err)
	}
	err := st.Create(ctx, durableSession("b"))
	if !notDurable(err) || !strings.Contains(err.Error(), `appendfsync "everysec"`) {
		t.Fatalf("create with appendfsync everysec: %v, want ErrNotDurable naming the policy", err)
	}
	if s, err := st.Get(ctx, "fn", "b"); err == nil && s.Status == session.StatusActive {
		t.Errorf("the create that was not acknowledged is still Active: %+v", s)
	}
	if _, err := redisstore.New(cfg, aof); err == nil || !strings.Contains(err.Error(), "appendfsync always") {
		t.Errorf("New on appendfsync everysec: %v, want a refusal asking for appendfsync always", err)
	}
	if _, err := srv.Do("CONFIG", "SET", "appendonly", "no"); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.New(cfg, aof); err == nil || !strings.Contains(err.Error(), `appendonly "no"`) {
		t.Errorf("New on appendonly no: %v, want a refusal naming appendonly", err)
	}

	if _, err := srv.Do("CONFIG", "SET", "appendonly", "yes", "appendfsync", "always"); err != nil {
		t.Fatal(err)
	}
	if err := st.Create(ctx, durableSession("c")); err != nil {
		t.Fatalf("create once appendfsync is always again: %v", err)
	}
	// The default, none, takes Redis as it is.
	if _, err := srv.Do("CONFIG", "SET", "appendonly", "no"); err != nil {
		t.Fatal(err)
	}
	if err := newRedisStore(t, cfg).Create(ctx, durableSession("d")); err != nil {
		t.Fatalf("create with ackDurability none on appendonly no: %v", err)
	}
}

// TestAckReplicaWaitsOnTheWritesConnection: with ackDurability replica an acknowledged create
// is on the replica when Create returns. With the replica stopped (SIGSTOP: still connected,
// acknowledging nothing) a create, an update and a placement answer ErrNotDurable within the
// WAIT timeout — which a WAIT on any other connection than the write's would not (it would
// count the replica's old acknowledgement and return at once) — and the unacknowledged create
// is ended again, its slot given back. Once the replica runs again, writes are acknowledged.
func TestAckReplicaWaitsOnTheWritesConnection(t *testing.T) {
	sn := redistest.StartSentinel(t)
	cfg := redisstore.Config{Addrs: []string{sn.Primary.Addr}, KeyPrefix: "t" + sessiontest.RandomHex(t, 6) + ":"}
	st := newRedisStore(t, cfg, redisstore.WithDurability(redisstore.Durability{Mode: redisstore.AckReplica, Timeout: 100 * time.Millisecond}),
		redisstore.WithOpTimeout(10*time.Second))
	ctx := context.Background()
	// After a (re)synchronization the primary streams writes to a replica only once the
	// replica's first acknowledgement came (within a second): until then WAIT counts none.
	testutil.EventuallyWithin(t, 30*time.Second, "the primary streaming to its replica (a create acknowledged)", func() bool {
		return st.Create(ctx, durableSession("w"+sessiontest.RandomHex(t, 4))) == nil
	})
	for _, id := range []string{"a1", "a2", "a3"} {
		if err := st.Create(ctx, durableSession(id)); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		// Read on the replica at once: WAIT returned only once it had the write.
		if out, err := sn.Replica.Do("HGET", st.KeyPrefix()+"{fn}:s:"+id, "inst"); err != nil || out != "i1" {
			t.Fatalf("session %s on the replica right after its create: %q, %v", id, out, err)
		}
	}
	cands := []session.PlaceCandidate{{Instance: "i1", Cap: 10}, {Instance: "i2", Cap: 10}}
	if _, _, err := st.PlaceCreate(ctx, durableSession("p1"), cands); err != nil {
		t.Fatalf("placement: %v", err)
	}
	held := func() int { // read past the client-side cache
		c := st.Client()
		n := 0
		for _, inst := range []string{"i1", "i2"} {
			v, err := c.Do(ctx, c.B().Hget().Key(st.KeyPrefix()+"{fn}:n").Field(inst).Build()).AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatal(err)
			}
			n += int(v)
		}
		return n
	}
	before := held()

	sn.Replica.Pause()
	resumed := false
	defer func() {
		if !resumed {
			sn.Replica.Resume()
		}
	}()
	if err := st.Create(ctx, durableSession("b1")); !notDurable(err) || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Fatalf("create with the replica stopped: %v, want ErrNotDurable (0 of 1 replicas)", err)
	}
	if s, err := st.Get(ctx, "fn", "b1"); err == nil && s.Status == session.StatusActive {
		t.Errorf("the create that was not acknowledged is still Active: %+v", s)
	}
	if _, _, err := st.PlaceCreate(ctx, durableSession("b2"), cands); !notDurable(err) {
		t.Fatalf("placement with the replica stopped: %v, want ErrNotDurable", err)
	}
	if after := held(); after != before {
		t.Errorf("session slots held: %d after an unacknowledged placement, %d before: want it given back", after, before)
	}
	_, err := st.Update(ctx, "fn", "a1", func(s *session.Session) error {
		s.Attributes = map[string]string{"k": "v"}
		return nil
	})
	if !notDurable(err) {
		t.Fatalf("update with the replica stopped: %v, want ErrNotDurable", err)
	}

	sn.Replica.Resume()
	resumed = true
	testutil.EventuallyWithin(t, 30*time.Second, "creates acknowledged once the replica runs again", func() bool {
		return st.Create(ctx, durableSession("c"+sessiontest.RandomHex(t, 4))) == nil
	})
}
