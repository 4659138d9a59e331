package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

var testAuth = config.Auth{Tokens: []config.Token{
	{Name: "admin", Token: "admin-secret", Services: []string{"*"}, Access: config.AccessWrite},
	{Name: "a-reader", Token: "a-read-secret", Services: []string{"a"}, Access: config.AccessRead},
	{Name: "a-writer", Token: "a-write-secret", Services: []string{"a", "c"}, Access: config.AccessWrite},
}}

func startAuth(t *testing.T) *apitest.Server {
	t.Helper()
	svcs := []registry.Service{affinitytest.Service("a", registry.AffinityCookie), affinitytest.Service("b", registry.AffinityCookie)}
	ins := append(affinitytest.Instances("a", 1), affinitytest.Instances("b", 1)...)
	return apitest.Start(t, svcs, ins, apitest.WithAuth(testAuth))
}

func TestAuthScopes(t *testing.T) {
	ctx := context.Background()
	create := func(svc string) func(c client) error {
		return func(c client) error {
			_, err := c.CreateSession(ctx, &tetherv1.CreateSessionRequest{Service: svc})
			return err
		}
	}
	list := func(svc string) func(c client) error {
		return func(c client) error {
			_, err := c.ListSessions(ctx, &tetherv1.ListSessionsRequest{Service: svc})
			return err
		}
	}
	get := func(svc string) func(c client) error {
		return func(c client) error {
			_, err := c.GetSession(ctx, svc, "0123456789abcdef0123456789abcdef")
			return err
		}
	}
	listInstances := func(svc string) func(c client) error {
		return func(c client) error {
			_, err := c.ListInstances(ctx, svc)
			return err
		}
	}
	setState := func(svc string) func(c client) error {
		return func(c client) error {
			_, err := c.SetInstanceState(ctx, svc, "i1", tetherv1.InstanceState_INSTANCE_STATE_ACTIVE)
			return err
		}
	}
	setHealth := func(svc string) func(c client) error {
		return func(c client) error {
			_, err := c.SetInstanceHealth(ctx, svc, "i1", tetherv1.InstanceHealth_INSTANCE_HEALTH_HEALTHY)
			return err
		}
	}
	tests := []struct {
		name  string
		token string
		call  func(c client) error
		code  codes.Code
	}{
		{"no token", "", list("a"), codes.Unauthenticated},
		{"no token on instances", "", listInstances("a"), codes.Unauthenticated},
		{"unknown token", "guess", list("a"), codes.Unauthenticated},
		{"token differing in the last byte", "admin-secreT", list("a"), codes.Unauthenticated},
		{"reader lists its service", "a-read-secret", list("a"), codes.OK},
		{"reader gets in its service", "a-read-secret", get("a"), codes.NotFound},
		{"reader lists instances of its service", "a-read-secret", listInstances("a"), codes.OK},
		{"reader cannot create", "a-read-secret", create("a"), codes.PermissionDenied},
		{"reader cannot change instances", "a-read-secret", setState("a"), codes.PermissionDenied},
		{"reader cannot set health", "a-read-secret", setHealth("a"), codes.PermissionDenied},
		{"reader cannot read service b", "a-read-secret", list("b"), codes.PermissionDenied},
		{"reader cannot get in service b", "a-read-secret", get("b"), codes.PermissionDenied},
		{"reader cannot list instances of service b", "a-read-secret", listInstances("b"), codes.PermissionDenied},
		{"scoped token learns nothing about unknown services", "a-read-secret", list("zzz"), codes.PermissionDenied},
		{"writer creates in its service", "a-write-secret", create("a"), codes.OK},
		{"writer changes its instances", "a-write-secret", setState("a"), codes.OK},
		{"writer sets health in its service", "a-write-secret", setHealth("a"), codes.OK},
		{"no token cannot set health", "", setHealth("a"), codes.Unauthenticated},
		{"writer cannot create in service b", "a-write-secret", create("b"), codes.PermissionDenied},
		{"writer cannot read service b", "a-write-secret", list("b"), codes.PermissionDenied},
		{"writer's other service does not exist", "a-write-secret", list("c"), codes.NotFound},
		{"wildcard token reads b", "admin-secret", list("b"), codes.OK},
		{"wildcard token writes b", "admin-secret", create("b"), codes.OK},
		{"wildcard token sees unknown services as missing", "admin-secret", list("zzz"), codes.NotFound},
	}
	forEachTransport(t, func(t *testing.T, tr transport) {
		srv := startAuth(t)
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				wantCode(t, tc.name, tc.call(tr.new(t, srv, tc.token)), tc.code, "")
			})
		}
	})
}

func httpGet(t *testing.T, url, authorization string) (int, string, http.Header) {
	t.Helper()
	var h []string
	if authorization != "" {
		h = []string{"Authorization", authorization}
	}
	r := testutil.Get(t, url, h...)
	return r.Status, r.Body, r.Header
}

func TestAuthHTTPAdminEndpoints(t *testing.T) {
	srv := startAuth(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body, _ := httpGet(t, srv.URL+p, ""); code != 200 {
			t.Errorf("%s without a token = %d %s, want 200", p, code, body)
		}
	}
	code, body, h := httpGet(t, srv.URL+"/v1/services", "")
	if code != 401 || !strings.Contains(body, `"errorCode":"Unauthenticated"`) || h.Get("WWW-Authenticate") == "" {
		t.Errorf("/v1/services without a token = %d %s (WWW-Authenticate %q), want 401 Unauthenticated", code, body, h.Get("WWW-Authenticate"))
	}
	for _, bad := range []string{"admin-secret", "Basic admin-secret", "Bearer", "Bearer "} {
		if code, _, _ := httpGet(t, srv.URL+"/v1/services", bad); code != 401 {
			t.Errorf("Authorization %q = %d, want 401", bad, code)
		}
	}
	names := func(authz string) []string {
		t.Helper()
		code, body, _ := httpGet(t, srv.URL+"/v1/services", authz)
		if code != 200 {
			t.Fatalf("/v1/services with %q = %d %s", authz, code, body)
		}
		var list api.ServiceList
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list.Services {
			out = append(out, s.Name)
		}
		return out
	}
	if diff := cmp.Diff([]string{"a", "b"}, names("bearer admin-secret")); diff != "" {
		t.Errorf("wildcard token's services (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a"}, names("Bearer a-read-secret")); diff != "" {
		t.Errorf("scoped token's services (-want +got):\n%s", diff)
	}
	if code, _, _ := httpGet(t, srv.URL+"/v1/services/b", "Bearer a-read-secret"); code != 403 {
		t.Errorf("GET /v1/services/b with a token for a = %d, want 403", code)
	}
	if code, _, _ := httpGet(t, srv.URL+"/v1/services/a", "Bearer a-read-secret"); code != 200 {
		t.Errorf("GET /v1/services/a with a token for a = %d, want 200", code)
	}
}

func TestCheckListenerSecurity(t *testing.T) {
	tokens := config.Auth{Tokens: []config.Token{{Name: "x", Token: "y", Services: []string{"*"}, Access: "read"}}}
	tests := []struct {
		addr    string
		auth    config.Auth
		wantErr bool
	}{
		{"127.0.0.1:9000", config.Auth{}, false},
		{"127.0.0.2:9000", config.Auth{}, false},
		{"[::1]:9000", config.Auth{}, false},
		{"localhost:9000", config.Auth{}, false},
		{"0.0.0.0:9000", config.Auth{}, true},
		{":9000", config.Auth{}, true},
		{"[::]:9000", config.Auth{}, true},
		{"10.1.2.3:9000", config.Auth{}, true},
		{"tether.example:9000", config.Auth{}, true},
		{"0.0.0.0:9000", tokens, false},
		{"0.0.0.0:9000", config.Auth{AllowInsecure: true}, false},
		{"no-port", config.Auth{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			var logged strings.Builder
			err := api.CheckListenerSecurity(tc.addr, tc.auth, newTextLogger(&logged))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr && tc.addr != "no-port" && !errors.Is(err, api.ErrInsecureListener) {
				t.Errorf("err = %v, want ErrInsecureListener", err)
			}
			warned := strings.Contains(logged.String(), "level=WARN")
			if want := tc.auth.AllowInsecure; warned != want {
				t.Errorf("warning logged = %v, want %v (log: %s)", warned, want, logged.String())
			}
		})
	}
}
