package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
)

// cliServer starts a real API server (registry, store, engine) with services web (cookie) and
// hdr (header field), two instances each.
func cliServer(t *testing.T, opts ...apitest.Option) *apitest.Server {
	t.Helper()
	svcs := []registry.Service{affinitytest.Service("web", registry.AffinityCookie), affinitytest.Service("hdr", registry.AffinityHeader)}
	ins := append(affinitytest.Instances("web", 2), affinitytest.Instances("hdr", 2)...)
	return apitest.Start(t, svcs, ins, opts...)
}

// cli runs a tether command line against srv (--addr appended) and returns its results.
func cli(t *testing.T, srv *apitest.Server, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCmd(t, append(args, "--addr", srv.Addr)...)
}

func decodeJSON[T any, P interface {
	*T
	protoMessage
}](t *testing.T, s string) P {
	t.Helper()
	var v T
	p := P(&v)
	if err := protojson.Unmarshal([]byte(s), p); err != nil {
		t.Fatalf("decoding %s: %v", s, err)
	}
	return p
}

func TestSessionsCLI(t *testing.T) {
	srv := cliServer(t)
	epoch := affinitytest.Epoch

	code, out, errOut := cli(t, srv, "sessions", "create", "-s", "hdr", "--id", "user-1", "--ttl", "1h", "--idle-timeout", "5m",
		"--disable-reuse", "--attr", "team=a", "--attr", "tier=gold", "-o", "json")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	created := decodeJSON[tetherv1.Session](t, out)
	want := &tetherv1.Session{Id: "user-1", Service: "hdr", AffinityKind: tetherv1.AffinityKind_AFFINITY_KIND_HEADER, Instance: "i1",
		CreateTime: timestamppb.New(epoch), UpdateTime: timestamppb.New(epoch), LastSeenTime: timestamppb.New(epoch),
		Ttl: durationpb.New(time.Hour), IdleTimeout: durationpb.New(5 * time.Minute), Status: tetherv1.SessionStatus_SESSION_STATUS_ACTIVE,
		DisableSessionIdReuse: true, Attributes: map[string]string{"team": "a", "tier": "gold"}, ExpireTime: timestamppb.New(epoch.Add(5 * time.Minute))}
	if diff := cmp.Diff(want, created, protocmp.Transform()); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
	if s, err := srv.Store.Get(context.Background(), "hdr", "user-1"); err != nil || s.Instance != "i1" || s.TTL != time.Hour {
		t.Errorf("store has %+v, %v; want the session on i1 with TTL 1h", s, err)
	}

	// Table output; flags after the positional id work too.
	code, out, errOut = cli(t, srv, "sessions", "get", "user-1", "-s", "hdr")
	wantTable := "" +
		"ID      INSTANCE  STATUS  KIND    TTL     IDLE  REUSE  CREATED               LAST SEEN             EXPIRES\n" +
		"user-1  i1        Active  header  1h0m0s  5m0s  no     2026-03-01T12:00:00Z  2026-03-01T12:00:00Z  2026-03-01T12:05:00Z\n"
	if code != 0 || out != wantTable {
		t.Errorf("get table: exit %d, stderr %q\n%s\nwant\n%s", code, errOut, out, wantTable)
	}

	for _, id := range []string{"user-2", "user-3"} {
		if code, _, errOut := cli(t, srv, "sessions", "create", "-s", "hdr", "--id", id); code != 0 {
			t.Fatalf("create %s: %s", id, errOut)
		}
	}
	code, out, _ = cli(t, srv, "sessions", "list", "-s", "hdr", "-o", "json")
	list := decodeJSON[tetherv1.ListSessionsResponse](t, out)
	if code != 0 || len(list.GetSessions()) != 3 || list.GetNextPageToken() != "" {
		t.Errorf("list json: exit %d, %v", code, list)
	}
	code, out, errOut = cli(t, srv, "sessions", "list", "-s", "hdr", "--limit", "2")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "user-1 ") ||
		!strings.HasPrefix(lines[2], "user-2 ") || !strings.Contains(errOut, "more sessions: --page-token ") {
		t.Errorf("list --limit 2: exit %d\n%s\nstderr %q; want a header, user-1, user-2 and a next-page hint", code, out, errOut)
	}
	code, out, _ = cli(t, srv, "sessions", "list", "-s", "hdr", "--limit", "2", "--all", "-o", "json")
	if all := decodeJSON[tetherv1.ListSessionsResponse](t, out); code != 0 || len(all.GetSessions()) != 3 {
		t.Errorf("list --all: exit %d, %d sessions, want 3", code, len(all.GetSessions()))
	}
	code, out, _ = cli(t, srv, "sessions", "list", "-s", "hdr", "--status", "Expired", "-o", "json")
	if none := decodeJSON[tetherv1.ListSessionsResponse](t, out); code != 0 || len(none.GetSessions()) != 0 {
		t.Errorf("list --status Expired: exit %d, %d sessions, want 0", code, len(none.GetSessions()))
	}

	code, out, errOut = cli(t, srv, "sessions", "update", "-s", "hdr", "user-1", "--ttl", "2h", "--disable-reuse=false", "-o", "json")
	if upd := decodeJSON[tetherv1.Session](t, out); code != 0 || upd.GetTtl().AsDuration() != 2*time.Hour || upd.GetDisableSessionIdReuse() ||
		upd.GetIdleTimeout().AsDuration() != 5*time.Minute {
		t.Errorf("update: exit %d %s: %v", code, errOut, upd)
	}

	code, out, errOut = cli(t, srv, "sessions", "delete", "-s", "hdr", "user-1")
	if code != 0 || out != "session user-1 of service hdr deleted\n" {
		t.Errorf("delete: exit %d %q %q", code, out, errOut)
	}
	code, out, _ = cli(t, srv, "sessions", "get", "-s", "hdr", "user-1")
	if code != 0 || !strings.Contains(out, " Terminated ") || !strings.Contains(out, "ended 2026-03-01T12:00:00Z") {
		t.Errorf("get after delete: exit %d\n%s", code, out)
	}
	if got, err := srv.Store.Get(context.Background(), "hdr", "user-1"); err != nil || got.Status != session.StatusTerminated {
		t.Errorf("store after delete: %+v %v", got, err)
	}
}

func TestSessionsCLIErrors(t *testing.T) {
	srv := cliServer(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"unknown session", []string{"sessions", "get", "-s", "hdr", "ghost"}, 1, `tether sessions: no session "ghost": never created, or purged after it ended`},
		{"unknown service", []string{"sessions", "list", "-s", "nope"}, 1, `tether sessions: unknown service "nope" (tether status lists the services)`},
		{"unknown service, instances", []string{"instances", "list", "-s", "nope"}, 1, `tether instances: unknown service "nope" (tether status lists the services)`},
		{"bad id", []string{"sessions", "get", "-s", "hdr", "bad id"}, 1, "InvalidArgument: session id \"bad id\" is malformed"},
		{"update unknown session", []string{"sessions", "update", "-s", "web", "0123456789abcdef0123456789abcdef", "--ttl", "1h"}, 1, `no session "0123456789abcdef0123456789abcdef"`},
		{"cookie service with an id", []string{"sessions", "create", "-s", "web", "--id", "mine"}, 1, "InvalidArgument"},
		{"no service", []string{"sessions", "list"}, 2, "tether sessions list: -s SERVICE is required (the service to act on; tether status lists them)\nusage: tether sessions list -s SERVICE"},
		{"missing id", []string{"sessions", "get", "-s", "hdr"}, 2, "tether sessions get: want 1 argument(s) after the flags (see the usage line), got 0 []\nusage: tether sessions get -s SERVICE ID"},
		{"update without changes", []string{"sessions", "update", "-s", "hdr", "x"}, 2, "nothing to change"},
		{"bad output", []string{"sessions", "list", "-s", "hdr", "-o", "yaml"}, 1, `-o "yaml": want table or json`},
		{"bad duration", []string{"sessions", "create", "-s", "hdr", "--ttl", "soon"}, 2, `invalid value "soon" for flag -ttl`},
		{"bad attribute", []string{"sessions", "create", "-s", "hdr", "--attr", "novalue"}, 2, "want KEY=VALUE"},
		{"unknown verb", []string{"sessions", "frob"}, 2, `tether sessions: unknown command "frob"`},
		{"no verb", []string{"sessions"}, 2, "usage: tether sessions COMMAND"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := cli(t, srv, tc.args...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantStderr) {
				t.Errorf("%q: exit %d stderr %q; want exit %d with %q", tc.args, code, stderr, tc.wantCode, tc.wantStderr)
			}
		})
	}
	t.Run("expired update refused", func(t *testing.T) {
		if code, _, stderr := cli(t, srv, "sessions", "create", "-s", "hdr", "--id", "brief", "--ttl", "1s"); code != 0 {
			t.Fatalf("create: %s", stderr)
		}
		srv.Clock.Advance(2 * time.Second)
		code, _, stderr := cli(t, srv, "sessions", "update", "-s", "hdr", "brief", "--ttl", "1h")
		if want := `tether sessions: session "brief" of service hdr expired at `; code != 1 || !strings.Contains(stderr, want) || !strings.Contains(stderr, ": it can no longer be changed") {
			t.Errorf("exit %d stderr %q; want %q… it can no longer be changed", code, stderr, want)
		}

	})
	t.Run("nothing listening", func(t *testing.T) {
		code, _, stderr := runCmd(t, "sessions", "list", "-s", "hdr", "--addr", "127.0.0.1:1")
		if want := "tether sessions: cannot reach tether at http://127.0.0.1:1: connection refused (is it running? -addr or TETHER_ADDR names the API listener)\n"; code != 1 || stderr != want {
			t.Errorf("exit %d stderr %q; want %q", code, stderr, want)
		}
	})
	t.Run("one name per flag in help", func(t *testing.T) {
		_, _, stderr := runCmd(t, "sessions", "list", "-h")
		for _, alias := range []string{"-service", "-output"} {
			if strings.Contains(stderr, "  "+alias+" ") {
				t.Errorf("help lists %s beside its short name:\n%s", alias, stderr)
			}
		}
		if !strings.Contains(stderr, "  -s service") || !strings.Contains(stderr, "  -o format") {
			t.Errorf("help lacks -s or -o:\n%s", stderr)
		}
	})
}

func TestSessionsCLIAuthAndEnv(t *testing.T) {
	srv := cliServer(t, apitest.WithAuth(config.Auth{Tokens: []config.Token{
		{Name: "ops", Token: "ops-secret", Services: []string{"*"}, Access: config.AccessWrite},
		{Name: "web-reader", Token: "web-secret", Services: []string{"web"}, Access: config.AccessRead},
	}}))
	code, _, stderr := cli(t, srv, "sessions", "list", "-s", "hdr")
	if code != 1 || !strings.Contains(stderr, "the API refused the token (401 ") || !strings.Contains(stderr, "pass -token or set TETHER_TOKEN") {
		t.Errorf("without a token: exit %d %q", code, stderr)
	}
	code, _, stderr = cli(t, srv, "sessions", "list", "-s", "hdr", "--token", "web-secret")
	if code != 1 || !strings.Contains(stderr, `the token may not do this (403): token "web-reader" may not read service "hdr"`) {
		t.Errorf("scoped token: exit %d %q", code, stderr)
	}
	t.Setenv("TETHER_ADDR", "http://"+srv.Addr+"/")
	t.Setenv("TETHER_TOKEN", "ops-secret")
	code, out, stderr := runCmd(t, "sessions", "list", "-s", "hdr")
	if code != 0 || !strings.HasPrefix(out, "ID ") {
		t.Errorf("address and token from the environment: exit %d %q %q", code, out, stderr)
	}
}

type protoMessage = interface {
	ProtoReflect() protoreflect.Message
}
