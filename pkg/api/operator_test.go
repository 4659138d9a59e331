package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestOperatorHandlerNeedsAnAllServicesToken: an operator endpoint (the xDS node status) is
// open without auth, and with auth only to tokens scoped to every service.
func TestOperatorHandlerNeedsAnAllServicesToken(t *testing.T) {
	status := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`[]`)) })
	auth := config.Auth{Tokens: []config.Token{
		{Name: "ops", Token: "ops-secret", Services: []string{"*"}, Access: config.AccessRead},
		{Name: "team", Token: "team-secret", Services: []string{"web"}, Access: config.AccessWrite},
	}}
	tests := []struct {
		name  string
		auth  config.Auth
		token string
		want  int
	}{
		{"no auth configured", config.Auth{}, "", http.StatusOK},
		{"all-services token", auth, "ops-secret", http.StatusOK},
		{"token scoped to one service", auth, "team-secret", http.StatusForbidden},
		{"no token", auth, "", http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(api.NewAdminHandler(registry.New(), api.WithAuth(tc.auth),
				api.WithOperatorHandler("GET /v1/xds/nodes", status)))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/xds/nodes", nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestOperatorWriteNeedsAnAllServicesWriteToken: an operator endpoint that changes the
// deployment (POST /v1/replica/drain) refuses a read-only token scoped to every service — the
// landed drain accepted any "*" token, read-only ones included — and a write token scoped to
// one service; an all-services write token may call it.
func TestOperatorWriteNeedsAnAllServicesWriteToken(t *testing.T) {
	var drained int
	drain := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { drained++; w.WriteHeader(http.StatusAccepted) })
	auth := config.Auth{Tokens: []config.Token{
		{Name: "viewer", Token: "viewer-secret", Services: []string{"*"}, Access: config.AccessRead},
		{Name: "team", Token: "team-secret", Services: []string{"web"}, Access: config.AccessWrite},
		{Name: "ops", Token: "ops-secret", Services: []string{"*"}, Access: config.AccessWrite},
	}}
	srv := httptest.NewServer(api.NewAdminHandler(registry.New(), api.WithAuth(auth),
		api.WithOperatorHandler("POST /v1/replica/drain", drain)))
	defer srv.Close()
	for _, tc := range []struct {
		token       string
		want, total int
	}{
		{"viewer-secret", http.StatusForbidden, 0},
		{"team-secret", http.StatusForbidden, 0},
		{"ops-secret", http.StatusAccepted, 1},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/replica/drain", nil)
		req.Header.Set("Authorization", "Bearer "+tc.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tc.want || drained != tc.total {
			t.Errorf("%s: status %d (drained %d times), want %d (%d)", tc.token, resp.StatusCode, drained, tc.want, tc.total)
		}
	}
}
