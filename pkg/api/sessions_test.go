package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
)

// world is the services every API test starts from:
//   - web: cookie affinity, instances i1, i2 (20 sessions each)
//   - hdr: header-field affinity, instances i1, i2
//   - mcp: MCP Streamable HTTP affinity; plain: no affinity
//   - tiny: cookie affinity, one instance with one session slot
func world() ([]registry.Service, []registry.Instance) {
	tiny := affinitytest.Service("tiny", registry.AffinityCookie)
	tiny.SessionsPerInstance = 1
	svcs := []registry.Service{
		affinitytest.Service("web", registry.AffinityCookie),
		affinitytest.Service("hdr", registry.AffinityHeader),
		affinitytest.Service("mcp", registry.AffinityMCPStreamable),
		affinitytest.Service("plain", registry.AffinityNone),
		tiny,
	}
	var ins []registry.Instance
	for _, s := range []string{"web", "hdr", "mcp", "plain"} {
		ins = append(ins, affinitytest.Instances(s, 2)...)
	}
	ins = append(ins, affinitytest.Instances("tiny", 1)...)
	return svcs, ins
}

func startWorld(t *testing.T, opts ...apitest.Option) *apitest.Server {
	t.Helper()
	svcs, ins := world()
	return apitest.Start(t, svcs, ins, opts...)
}

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func TestSessionLifecycle(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		ctx := context.Background()
		t0 := srv.Clock.Now()

		created, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{
			Service: "web", Ttl: durationpb.New(time.Hour), IdleTimeout: durationpb.New(10 * time.Minute),
			DisableSessionIdReuse: new(true), Attributes: map[string]string{"tenant": "acme"},
		})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if len(created.GetId()) != 32 || created.GetInstance() == "" {
			t.Fatalf("created session has id %q instance %q; want a generated 32-hex id and an instance", created.GetId(), created.GetInstance())
		}
		want := &tetherv1.Session{
			Id: created.GetId(), Service: "web", AffinityKind: tetherv1.AffinityKind_AFFINITY_KIND_COOKIE,
			Instance: created.GetInstance(), CreateTime: ts(t0), UpdateTime: ts(t0), LastSeenTime: ts(t0),
			Ttl: durationpb.New(time.Hour), IdleTimeout: durationpb.New(10 * time.Minute),
			Status: tetherv1.SessionStatus_SESSION_STATUS_ACTIVE, DisableSessionIdReuse: true,
			Attributes: map[string]string{"tenant": "acme"}, ExpireTime: ts(t0.Add(10 * time.Minute)),
		}
		if diff := cmp.Diff(want, created, protocmp.Transform()); diff != "" {
			t.Errorf("created (-want +got):\n%s", diff)
		}
		got, err := c.GetSession(ctx, "web", created.GetId())
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("get (-want +got):\n%s", diff)
		}
		// The session holds a slot on its instance at once.
		usage := srv.Usage(t, "web")
		if usage[created.GetInstance()][0] != 1 {
			t.Errorf("usage after create = %v, want one session on %s", usage, created.GetInstance())
		}

		// Update: longer TTL, no idle timeout, reuse allowed; takes effect at once, same instance.
		srv.Clock.Advance(time.Minute)
		updated, err := c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{
			Service: "web", SessionId: created.GetId(), Ttl: durationpb.New(2 * time.Hour),
			IdleTimeout: durationpb.New(0), DisableSessionIdReuse: new(false),
		})
		if err != nil {
			t.Fatalf("update: %v", err)
		}
		want.Ttl, want.IdleTimeout, want.DisableSessionIdReuse = durationpb.New(2*time.Hour), durationpb.New(0), false
		want.UpdateTime, want.ExpireTime = ts(t0.Add(time.Minute)), ts(t0.Add(2*time.Hour))
		if diff := cmp.Diff(want, updated, protocmp.Transform()); diff != "" {
			t.Errorf("updated (-want +got):\n%s", diff)
		}
		// Only the given fields change.
		updated, err = c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{Service: "web", SessionId: created.GetId(), Ttl: durationpb.New(3 * time.Hour)})
		if err != nil {
			t.Fatalf("update ttl only: %v", err)
		}
		if updated.GetIdleTimeout().AsDuration() != 0 || updated.GetTtl().AsDuration() != 3*time.Hour || updated.GetDisableSessionIdReuse() {
			t.Errorf("partial update changed other fields: %v", updated)
		}

		list, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "web"})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		if len(list.GetSessions()) != 1 || list.GetSessions()[0].GetId() != created.GetId() || list.GetNextPageToken() != "" {
			t.Errorf("list = %v, want just the session", list)
		}

		srv.Clock.Advance(time.Minute)
		if err := c.DeleteSession(ctx, "web", created.GetId()); err != nil {
			t.Fatalf("delete: %v", err)
		}
		got, err = c.GetSession(ctx, "web", created.GetId())
		if err != nil {
			t.Fatalf("get after delete: %v", err)
		}
		if got.GetStatus() != tetherv1.SessionStatus_SESSION_STATUS_TERMINATED || !got.GetEndTime().AsTime().Equal(t0.Add(2*time.Minute)) {
			t.Errorf("after delete: status %v end %v, want TERMINATED at t0+2m", got.GetStatus(), got.GetEndTime().AsTime())
		}
		testutil.Eventually(t, "the deleted session's slot to be freed", func() bool {
			return srv.Usage(t, "web")[created.GetInstance()][0] == 0
		})
		_, err = c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{Service: "web", SessionId: created.GetId(), Ttl: durationpb.New(time.Hour)})
		wantCode(t, "update after delete", err, codes.FailedPrecondition, "ended")
		wantCode(t, "delete twice", c.DeleteSession(ctx, "web", created.GetId()), codes.FailedPrecondition, "")
	})
}

func TestSessionCustomIDs(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		ctx := context.Background()
		s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "user-42"})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if s.GetId() != "user-42" || s.GetAffinityKind() != tetherv1.AffinityKind_AFFINITY_KIND_HEADER ||
			s.GetTtl().AsDuration() != 6*time.Hour || s.GetIdleTimeout().AsDuration() != 30*time.Minute {
			t.Errorf("session = %v, want id user-42, header kind, the service's TTL 6h and idle 30m", s)
		}
		_, err = c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "user-42"})
		wantCode(t, "duplicate id", err, codes.AlreadyExists, "")
		// Reuse disabled: once ended, the id may not be created again.
		if _, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "once", DisableSessionIdReuse: new(true)}); err != nil {
			t.Fatalf("create once: %v", err)
		}
		srv.Clock.Advance(7 * time.Hour)
		_, err = c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "once"})
		wantCode(t, "recreate an expired id with reuse disabled", err, codes.AlreadyExists, "reused")
	})
}

func TestSessionErrors(t *testing.T) {
	long := strings.Repeat("a", 65)
	type call func(ctx context.Context, c client) error
	tests := []struct {
		name string
		call call
		code codes.Code
		msg  string
	}{
		{"create unknown service", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "nope"})
			return err
		}, codes.NotFound, "nope"},
		{"get unknown service", func(ctx context.Context, c client) error {
			_, err := c.GetSession(ctx, "nope", "abc")
			return err
		}, codes.NotFound, ""},
		{"update unknown service", func(ctx context.Context, c client) error {
			_, err := c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{Service: "nope", SessionId: "abc"})
			return err
		}, codes.NotFound, ""},
		{"list unknown service", func(ctx context.Context, c client) error {
			_, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "nope"})
			return err
		}, codes.NotFound, ""},
		{"delete unknown service", func(ctx context.Context, c client) error {
			return c.DeleteSession(ctx, "nope", "abc")
		}, codes.NotFound, ""},
		{"get unknown id", func(ctx context.Context, c client) error {
			_, err := c.GetSession(ctx, "web", "0123456789abcdef0123456789abcdef")
			return err
		}, codes.NotFound, ""},
		{"update unknown id", func(ctx context.Context, c client) error {
			_, err := c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{Service: "hdr", SessionId: "ghost", Ttl: durationpb.New(time.Hour)})
			return err
		}, codes.NotFound, ""},
		{"delete unknown id", func(ctx context.Context, c client) error {
			return c.DeleteSession(ctx, "hdr", "ghost")
		}, codes.NotFound, ""},
		{"get malformed id", func(ctx context.Context, c client) error {
			_, err := c.GetSession(ctx, "web", "bad id!")
			return err
		}, codes.InvalidArgument, "malformed"},
		{"get id starting with a dash", func(ctx context.Context, c client) error {
			_, err := c.GetSession(ctx, "hdr", "-abc")
			return err
		}, codes.InvalidArgument, "malformed"},
		{"update too long id", func(ctx context.Context, c client) error {
			_, err := c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{Service: "hdr", SessionId: long})
			return err
		}, codes.InvalidArgument, "malformed"},
		{"delete malformed id", func(ctx context.Context, c client) error {
			return c.DeleteSession(ctx, "hdr", "a/b")
		}, codes.InvalidArgument, "malformed"},
		{"list malformed id filter", func(ctx context.Context, c client) error {
			_, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "hdr", SessionId: "x y"})
			return err
		}, codes.InvalidArgument, "malformed"},
		{"create malformed custom id", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "no spaces"})
			return err
		}, codes.InvalidArgument, "malformed"},
		{"create custom id on a cookie service", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web", SessionId: "mine"})
			return err
		}, codes.InvalidArgument, "cookie"},
		{"create TTL above 6h", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web", Ttl: durationpb.New(7 * time.Hour)})
			return err
		}, codes.InvalidArgument, "TTL"},
		{"create idle timeout above TTL", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web", Ttl: durationpb.New(time.Minute), IdleTimeout: durationpb.New(time.Hour)})
			return err
		}, codes.InvalidArgument, "idle"},
		{"create negative TTL", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web", Ttl: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument, "negative"},
		{"create with the reserved provisional attribute (issue 25)", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web", Attributes: map[string]string{"tether.provisional": "true"}})
			return err
		}, codes.InvalidArgument, "reserved"},
		{"create on an MCP service", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "mcp"})
			return err
		}, codes.FailedPrecondition, "MCP client and server"},
		{"list on a service without affinity", func(ctx context.Context, c client) error {
			_, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "plain"})
			return err
		}, codes.FailedPrecondition, "plain"},
		// MCP sessions and handles are seen through the API (#25 finding 3): an unknown id is
		// not found.
		{"get an unknown MCP session", func(ctx context.Context, c client) error {
			_, err := c.GetSession(ctx, "mcp", "abc")
			return err
		}, codes.NotFound, "not found"},
		{"create on a service without affinity", func(ctx context.Context, c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "plain"})
			return err
		}, codes.FailedPrecondition, "no sessions"},
		{"bad page token", func(ctx context.Context, c client) error {
			_, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "web", PageToken: "not-a-token"})
			return err
		}, codes.InvalidArgument, "token"},
		{"no capacity", func(ctx context.Context, c client) error {
			if _, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "tiny"}); err != nil {
				return fmt.Errorf("first session: %w", err)
			}
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "tiny"})
			return err
		}, codes.Unavailable, ""},
	}
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				wantCode(t, tc.name, tc.call(context.Background(), c), tc.code, tc.msg)
			})
		}
	})
}

func TestExpiredSession(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		ctx := context.Background()
		t0 := srv.Clock.Now()
		s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "short", Ttl: durationpb.New(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		srv.Clock.Advance(11 * time.Second)
		got, err := c.GetSession(ctx, "hdr", s.GetId())
		if err != nil {
			t.Fatalf("get expired: %v", err)
		}
		if got.GetStatus() != tetherv1.SessionStatus_SESSION_STATUS_EXPIRED || !got.GetEndTime().AsTime().Equal(t0.Add(10*time.Second)) {
			t.Errorf("expired session: status %v end %v, want EXPIRED at t0+10s", got.GetStatus(), got.GetEndTime().AsTime())
		}
		_, err = c.UpdateSession(ctx, &tetherv1.UpdateSessionRequest{Service: "hdr", SessionId: s.GetId(), Ttl: durationpb.New(time.Hour)})
		wantCode(t, "update expired", err, codes.FailedPrecondition, "")
		again, err := c.GetSession(ctx, "hdr", s.GetId())
		if err != nil || again.GetTtl().AsDuration() != 10*time.Second {
			t.Errorf("refused update changed the session: %v, %v", again, err)
		}
		for _, f := range []struct {
			st   tetherv1.SessionStatus
			want int
		}{
			{tetherv1.SessionStatus_SESSION_STATUS_EXPIRED, 1},
			{tetherv1.SessionStatus_SESSION_STATUS_ACTIVE, 0},
			{tetherv1.SessionStatus_SESSION_STATUS_UNSPECIFIED, 1},
		} {
			list, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: "hdr", Status: f.st})
			if err != nil {
				t.Fatalf("list %v: %v", f.st, err)
			}
			if len(list.GetSessions()) != f.want {
				t.Errorf("list status %v: %d sessions, want %d", f.st, len(list.GetSessions()), f.want)
			}
		}
	})
}

// TestCreatedSessionRoutesAndDeleteStartsNew drives the real engine the way ext_proc does: a
// request carrying a pre-created session's id lands on its pre-placed instance, and after a
// delete the same id starts a new session.
func TestCreatedSessionRoutesAndDeleteStartsNew(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startWorld(t)
		c := tr.new(t, srv, "")
		ctx := context.Background()

		decide := func(req affinity.Request) affinity.Decision {
			t.Helper()
			d, err := srv.Engine.Decide(ctx, req)
			if err != nil {
				t.Fatalf("decide: %v", err)
			}
			d.End()
			return d
		}
		// Several cookie sessions, so both instances get some.
		for i := range 25 {
			s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web"})
			if err != nil {
				t.Fatalf("create %d: %v", i, err)
			}
			d := decide(affinitytest.HTTP("web", "GET", "/", "cookie", "tether-session="+s.GetId()))
			if d.Instance().ID != s.GetInstance() || d.NewSession() || d.SessionID() != s.GetId() {
				t.Errorf("request with session %s went to %s (new %v, id %q), want pre-placed %s",
					s.GetId(), d.Instance().ID, d.NewSession(), d.SessionID(), s.GetInstance())
			}
		}
		hs, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "hdr", SessionId: "user-7"})
		if err != nil {
			t.Fatal(err)
		}
		if d := decide(affinitytest.HTTP("hdr", "GET", "/", "x-tether-session", "user-7")); d.Instance().ID != hs.GetInstance() || d.NewSession() {
			t.Errorf("header request went to %s (new %v), want %s", d.Instance().ID, d.NewSession(), hs.GetInstance())
		}

		// Delete, then a request with the same id is a new session.
		s, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: "web", DisableSessionIdReuse: new(true)})
		if err != nil {
			t.Fatal(err)
		}
		srv.Clock.Advance(time.Minute)
		if err := c.DeleteSession(ctx, "web", s.GetId()); err != nil {
			t.Fatalf("delete: %v", err)
		}
		d := decide(affinitytest.HTTP("web", "GET", "/", "cookie", "tether-session="+s.GetId()))
		if !d.NewSession() {
			t.Fatalf("request after delete continued the old session; want a new one")
		}
		renewed, err := c.GetSession(ctx, "web", d.SessionID())
		if err != nil {
			t.Fatalf("get the new session: %v", err)
		}
		if renewed.GetStatus() != tetherv1.SessionStatus_SESSION_STATUS_ACTIVE || !renewed.GetCreateTime().AsTime().After(s.GetCreateTime().AsTime()) {
			t.Errorf("session after delete: status %v created %v; want a new Active session created after %v",
				renewed.GetStatus(), renewed.GetCreateTime().AsTime(), s.GetCreateTime().AsTime())
		}
	})
}
