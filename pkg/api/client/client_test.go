package client_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api/apitest"
	"github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestClientAgainstARealServer: the client creates and lists sessions on a real API server,
// sends its token, and turns error answers into *client.Error with the API's code.
func TestClientAgainstARealServer(t *testing.T) {
	srv := apitest.Start(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)},
		affinitytest.Instances("web", 2),
		apitest.WithAuth(config.Auth{Tokens: []config.Token{{Name: "w", Token: "secret-w", Services: []string{"*"}, Access: config.AccessWrite}}}))
	ctx := context.Background()

	c, err := client.New(srv.Addr, client.WithToken("secret-w"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Base() != "http://"+srv.Addr {
		t.Errorf("Base() = %q", c.Base())
	}
	s := &tetherv1.Session{}
	if err := c.Call(ctx, http.MethodPost, "/v1/services/web/sessions", &tetherv1.CreateSessionRequest{}, s); err != nil {
		t.Fatal(err)
	}
	list := &tetherv1.ListSessionsResponse{}
	if err := c.Call(ctx, http.MethodGet, "/v1/services/web/sessions", nil, list); err != nil {
		t.Fatal(err)
	}
	if len(list.GetSessions()) != 1 || list.GetSessions()[0].GetId() != s.GetId() {
		t.Fatalf("listed %v, want the created session %s", list.GetSessions(), s.GetId())
	}

	var apiErr *client.Error
	err = c.Call(ctx, http.MethodGet, "/v1/services/web/sessions/nosuch", nil, &tetherv1.Session{})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Code == "" {
		t.Fatalf("unknown session: %v, want a 404 *client.Error", err)
	}
	bad, err := client.New(srv.Addr, client.WithToken("wrong"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Call(ctx, http.MethodGet, "/v1/services/web/sessions", nil, nil); !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v, want 401", err)
	}
}

func TestNewRefusesBadAddresses(t *testing.T) {
	for _, a := range []string{"ftp://x:1", "http:///path", "::bad"} {
		if _, err := client.New(a); err == nil {
			t.Errorf("New(%q) succeeded", a)
		}
	}
	for a, want := range map[string]string{"127.0.0.1:9000": "http://127.0.0.1:9000", "https://h:1/": "https://h:1"} {
		c, err := client.New(a)
		if err != nil || c.Base() != want {
			t.Errorf("New(%q) = %v, %v; want base %s", a, c, err, want)
		}
	}
}
