package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/api/apitest"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// TestStatusStreamPoolPerCaller is the regression test for issue 25's finding 6 (the 64 status
// streams were one pool: one token took them all): one token holds at most
// MaxStatusStreamsPerCaller, and another token still gets one.
func TestStatusStreamPoolPerCaller(t *testing.T) {
	fx := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, affinitytest.Instances("web", 1))
	a := status.New(fx.Registry, fx.Engine)
	srv := apitest.Serve(t, fx, apitest.WithAuth(config.Auth{Tokens: []config.Token{
		{Name: "greedy", Token: "greedy-secret", Services: []string{"*"}},
		{Name: "other", Token: "other-secret", Services: []string{"*"}},
	}}), apitest.WithAPIOptions(api.WithStatus(a.Snapshot, time.Hour)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(token string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/status/stream", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp.StatusCode
	}
	for i := range api.MaxStatusStreamsPerCaller {
		if got := open("greedy-secret"); got != http.StatusOK {
			t.Fatalf("greedy's stream %d: %d", i, got)
		}
	}
	if got := open("greedy-secret"); got != http.StatusServiceUnavailable {
		t.Errorf("greedy's stream %d: %d, want 503", api.MaxStatusStreamsPerCaller+1, got)
	}
	if got := open("other-secret"); got != http.StatusOK {
		t.Errorf("another token's stream after greedy's: %d, want 200", got)
	}
}
