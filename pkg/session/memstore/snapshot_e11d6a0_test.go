package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// TestRestoresE11d6a0Snapshot: a snapshot file written by the build at commit e11d6a0 (the
// fixture testdata/e11d6a0.snap, made by testdata/mkfixture_e11d6a0.go.txt run in a checkout
// of e11d6a0: `git worktree add /tmp/t e11d6a0 && cp …/mkfixture_e11d6a0.go.txt
// /tmp/t/cmd/mkfixture/main.go && (cd /tmp/t && go run ./cmd/mkfixture OUT)`) is restored by
// this build whole: every session of every kind, its times, attributes, reuse flag and end,
// and the restored sessions are served and can end.
func TestRestoresE11d6a0Snapshot(t *testing.T) {
	at := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC) // the fixture's clock
	created := at.Add(-10 * time.Minute)                // LastModified is when e11d6a0 wrote them: at
	now := at.Add(time.Minute)
	st := memstore.New(memstore.WithClock(func() time.Time { return now }))
	n, err := st.RestoreSnapshot("testdata/e11d6a0.snap")
	if err != nil {
		t.Fatal(err)
	}
	if n != 7 {
		t.Fatalf("restored %d sessions, want 7", n)
	}
	active := func(id, svc, inst string, k session.Kind, ttl, idle time.Duration, reuse bool, attrs map[string]string) session.Session {
		return session.Session{ID: id, Service: svc, Instance: inst, Kind: k, Created: created, LastModified: at, LastSeen: created,
			TTL: ttl, IdleTimeout: idle, Status: session.StatusActive, DisableReuse: reuse, Attributes: attrs}
	}
	ended := active("ended-1", "api", "api-2", session.KindHeader, time.Hour, 0, false, nil)
	ended.Status, ended.Ended = session.StatusTerminated, at.Add(-time.Minute)
	for _, want := range []session.Session{
		active("0123456789abcdef0123456789abcdef", "web", "web-1", session.KindCookie, 24*time.Hour, time.Hour, false, map[string]string{"user": "alice", "tenant": "t1"}),
		active("fedcba9876543210fedcba9876543210", "web", "web-2", session.KindCookie, 24*time.Hour, 0, true, nil),
		active("hdr-session-1", "api", "api-1", session.KindHeader, time.Hour, 0, false, nil),
		active("mcp-7f3a", "mcp", "mcp-1", session.KindMCPStreamable, 2*time.Hour, 30*time.Minute, false, nil),
		active("sse-1", "mcp", "mcp-2", session.KindMCPSSE, 2*time.Hour, 0, false, nil),
		active("sticky-1", "web", "web-1", session.KindSticky, time.Hour, 0, false, nil),
		ended,
	} {
		got, err := st.Get(context.Background(), want.Service, want.ID)
		if err != nil {
			t.Errorf("%s/%s: %v", want.Service, want.ID, err)
			continue
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s/%s restored (-want +got):\n%s", want.Service, want.ID, d)
		}
	}
	if _, err := st.End(context.Background(), "web", "0123456789abcdef0123456789abcdef", session.StatusTerminated, now); err != nil {
		t.Errorf("ending a restored session: %v", err)
	}
}
