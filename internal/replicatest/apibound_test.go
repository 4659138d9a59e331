package replicatest_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/replicatest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	apiclient "github.com/tether-dev/tether/pkg/api/client"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/quota"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestSessionAPIHasItsOwnStoreBound: with Redis slower than the request path's store bound
// (tether serve's, a quarter of the default message_timeout: 125 ms) but well inside the
// SessionAPI's (api.storeTimeout, 2 s by default), an operator's create, read and delete
// succeed, while a new session on the request path still gets its fast 503 StoreUnavailable.
// Before the SessionAPI had its own bound, its create shared the request path's and got 503.
func TestSessionAPIHasItsOwnStoreBound(t *testing.T) {
	srv := redistest.Start(t)
	p := faultproxy.Start(t, srv.Addr)
	svc := benchService(50)
	reps := replicatest.Start(t, srv.Addr, 1, []registry.Service{svc}, affinitytest.Instances("fn", 2), replicatest.Options{
		Addr:      func(string) string { return p.Addr },
		OpTimeout: quota.CallTimeout(wire.DefaultMessageTimeout), // tether serve's request-path bound
	})
	r := reps[0]
	hs := httptest.NewServer(api.NewServer(r.Registry, api.WithEngine(r.Engine)).Handler()) // the default api.storeTimeout
	t.Cleanup(hs.Close)
	c, err := apiclient.New(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Each chunk waits 150 ms each way: a store call takes at least 300 ms, beyond 125 ms.
	p.SetLatency(150 * time.Millisecond)
	_, err = decide(r.Engine, "")
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Code != "StoreUnavailable" {
		t.Fatalf("a new session on the request path with Redis slower than its bound: %v; want 503 StoreUnavailable", err)
	}

	var created tetherv1.Session
	if err := c.Call(ctx, http.MethodPost, "/v1/services/fn/sessions", &tetherv1.CreateSessionRequest{}, &created); err != nil {
		t.Fatalf("SessionAPI create with Redis slower than the request path's bound: %v; want it created", err)
	}
	path := "/v1/services/fn/sessions/" + created.GetId()
	var got tetherv1.Session
	if err := c.Call(ctx, http.MethodGet, path, nil, &got); err != nil || got.GetId() != created.GetId() {
		t.Fatalf("SessionAPI get of the new session: %v (id %q), want %q", err, got.GetId(), created.GetId())
	}
	if err := c.Call(ctx, http.MethodDelete, path, nil, nil); err != nil {
		t.Fatalf("SessionAPI delete: %v", err)
	}

	p.SetLatency(0) // the request path places sessions again (chunks already delayed drain first)
	testutil.Eventually(t, "a new session placed on the request path once Redis is fast again", func() bool {
		d, err := decide(r.Engine, "")
		if err == nil {
			d.End()
		}
		return err == nil
	})
}
