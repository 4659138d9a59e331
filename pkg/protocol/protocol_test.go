package protocol_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/protocol"
)

func TestProtocolOfName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want int
	}{
		{"tether", 1},
		{"tether/2", 2},
		{"tether/17", 17},
		{"tether-seed", 0},
		{"tether/", 0},
		{"tether/x", 0},
		{"tether/0", 0},
		{"", 0},
		{"other", 0},
	} {
		if got := protocol.ProtocolOfName(tc.name); got != tc.want {
			t.Errorf("ProtocolOfName(%q) = %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := protocol.ProtocolOfName(protocol.ClientName()); got != protocol.Current {
		t.Errorf("this build's name %q registers %d, want %d", protocol.ClientName(), got, protocol.Current)
	}
}

func named(t *testing.T, addr, name string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ClientName: name, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestWatcherSpeaksTheLowestConnected: a replica speaks protocol 1 while a connection named
// "tether" (a replica of e11d6a0) is open, switches to 2 once it is closed (and records the data
// set's protocol), and back to 1 when such a connection appears again (a rollback).
func TestWatcherSpeaksTheLowestConnected(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	me := named(t, srv.Addr, protocol.ClientName())
	defer me.Close()
	old := named(t, srv.Addr, "tether")
	if err := old.Do(ctx, old.B().Ping().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int64
	var last atomic.Int64
	w := protocol.NewWatcher(me, "p:", time.Hour, nil, func(p int) { changes.Add(1); last.Store(int64(p)) })
	if err := w.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Speaking() != 1 || last.Load() != 1 {
		t.Fatalf("with a replica of e11d6a0 connected: speaking %d (last change %d), want 1", w.Speaking(), last.Load())
	}
	if n, err := protocol.DataSet(ctx, me, "p:"); err != nil || n != 0 {
		t.Fatalf("data set protocol while mixed: %d %v, want 0", n, err)
	}
	old.Close()
	testutil.Eventually(t, "protocol 2 once the e11d6a0 replica is gone", func() bool {
		return w.Sync(ctx) == nil && w.Speaking() == 2
	})
	if n, err := protocol.DataSet(ctx, me, "p:"); err != nil || n != 2 {
		t.Fatalf("data set protocol after the switch: %d %v, want 2", n, err)
	}
	again := named(t, srv.Addr, "tether")
	defer again.Close()
	if err := again.Do(ctx, again.B().Ping().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(ctx); err != nil || w.Speaking() != 1 {
		t.Fatalf("an e11d6a0 replica back: speaking %d (%v), want 1", w.Speaking(), err)
	}
	if changes.Load() != 3 {
		t.Errorf("%d changes announced, want 3 (1, 2, 1)", changes.Load())
	}
}

// TestCheckRefusesANewerDataSet: a data set switched to a protocol above this build's is
// refused with ErrNewer; its own, an older one or none is not.
func TestCheckRefusesANewerDataSet(t *testing.T) {
	srv := redistest.Start(t)
	c := named(t, srv.Addr, "test")
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		val  string // "" none
		want error
	}{
		{"", nil},
		{"1", nil},
		{"2", nil},
		{"3", protocol.ErrNewer},
	} {
		if tc.val == "" {
			_, _ = srv.Do("DEL", "p:protocol")
		} else if _, err := srv.Do("SET", "p:protocol", tc.val); err != nil {
			t.Fatal(err)
		}
		if err := protocol.Check(ctx, c, "p:"); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("data set at %q: Check = %v, want %v", tc.val, err, tc.want)
		}
	}
	_, _ = srv.Do("SET", "p:protocol", "x")
	if err := protocol.Check(ctx, c, "p:"); err == nil {
		t.Error("a malformed protocol key was accepted")
	}
}
