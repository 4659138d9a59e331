package api_test

import (
	"encoding/json"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/api/apitest"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestBrowserGuard: the Host, Origin and non-simple-write rules of the browser guard, on a
// token-less API (the quickstart's) and one with tokens, over a real loopback listener. The
// attacks in a real browser are cmd/tether's TestBrowserCannotDriveTheAPI.
func TestBrowserGuard(t *testing.T) {
	svcs := []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}
	open := apitest.Start(t, svcs, affinitytest.Instances("web", 2),
		apitest.WithAPIOptions(api.WithHosts("tether.internal"), api.WithOrigins("https://ops.example.com")))
	authed := apitest.Start(t, svcs, affinitytest.Instances("web", 2), apitest.WithAuth(config.Auth{Tokens: []config.Token{
		{Name: "ops", Token: "ops-secret", Services: []string{"*"}, Access: config.AccessWrite}}}))
	const create = "/v1/services/web/sessions"
	client := []string{wire.ClientHeader, "test", "Content-Type", "application/json"}
	with := func(h []string, more ...string) []string { return append(append([]string{}, h...), more...) }
	for _, tc := range []struct {
		name         string
		srv          *apitest.Server
		method, path string
		body         string
		headers      []string
		want         int
	}{
		{"read by address", open, "GET", "/v1/status", "", nil, 404}, // no WithStatus here: past the guard
		{"read by localhost", open, "GET", "/v1/services", "", []string{"Host", "localhost"}, 200},
		{"read by a .localhost name", open, "GET", "/v1/services", "", []string{"Host", "app.localhost:9000"}, 200},
		{"read by a configured name", open, "GET", "/v1/services", "", []string{"Host", "Tether.Internal:9000"}, 200},
		{"rebinding read", open, "GET", "/v1/services", "", []string{"Host", "attacker.example:9000"}, 403},
		{"rebinding health", open, "GET", "/healthz", "", []string{"Host", "attacker.example"}, 403},
		{"rebinding write with the client header", open, "POST", create, "{}", with(client, "Host", "attacker.example"), 403},
		{"write with the client header", open, "POST", create, "{}", client, 201},
		{"write without a body", open, "POST", create, "", []string{wire.ClientHeader, "x"}, 201},
		{"write without the client header", open, "POST", create, "{}", []string{"Content-Type", "application/json"}, 403},
		{"text/plain write", open, "POST", create, "{}", []string{wire.ClientHeader, "x", "Content-Type", "text/plain"}, 400},
		{"untyped body", open, "POST", create, "{}", []string{wire.ClientHeader, "x"}, 400},
		{"write with any Authorization (auth off)", open, "POST", create, "{}", []string{"Authorization", "Bearer x"}, 201},
		{"cross-origin read", open, "GET", "/v1/services", "", []string{"Origin", "http://127.0.0.1:1"}, 403},
		{"cross-origin write", open, "POST", create, "{}", with(client, "Origin", "http://evil.example"), 403},
		{"null origin", open, "POST", create, "{}", with(client, "Origin", "null"), 403},
		{"configured origin", open, "POST", create, "{}", with(client, "Origin", "https://ops.example.com"), 201},
		{"same origin (the dashboard)", open, "POST", create, "{}", with(client, "Origin", "http://"+open.Addr), 201},
		{"same origin by localhost", open, "GET", "/v1/services", "", []string{"Host", "localhost:1", "Origin", "http://localhost:1"}, 200},
		{"preflight gets no CORS grant", open, "OPTIONS", create, "", []string{"Origin", "http://evil.example", "Access-Control-Request-Method", "POST"}, 403},
		{"token with a foreign Host", authed, "GET", "/v1/services", "", []string{"Host", "tether.ns.svc", "Authorization", "Bearer ops-secret"}, 200},
		{"token write without the client header", authed, "POST", create, "{}", []string{"Authorization", "Bearer ops-secret", "Content-Type", "text/plain"}, 201},
		{"token from another origin", authed, "GET", "/v1/services", "", []string{"Authorization", "Bearer ops-secret", "Origin", "http://evil.example"}, 403},
		{"no token, foreign Host", authed, "GET", "/v1/services", "", []string{"Host", "attacker.example"}, 401},
		{"health, foreign Host, auth on", authed, "GET", "/healthz", "", []string{"Host", "attacker.example"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testutil.Do(t, tc.method, tc.srv.URL+tc.path, tc.body, tc.headers...)
			if r.Status != tc.want {
				t.Fatalf("HTTP %d, want %d: %s", r.Status, tc.want, r.Body)
			}
			if r.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("a CORS grant: %v", r.Header)
			}
			if r.Status == 403 || r.Status == 400 {
				var e struct{ ErrorCode, ErrorMessage string }
				if err := json.Unmarshal([]byte(r.Body), &e); err != nil || e.ErrorMessage == "" {
					t.Errorf("refusal outside the error model: %q", r.Body)
				}
			}
		})
	}
}
