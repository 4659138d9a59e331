package extproc_test

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestExpiredExchangeIsResetNotFreed (#14 finding 2): an SSE stream open past its service's
// maxLifetime is reset (an ImmediateResponse on its side stream: Envoy resets the downstream
// stream and closes the side stream), counted, and its request slot stays held until the
// stream really ends; a stream within its limit is untouched.
func TestExpiredExchangeIsResetNotFreed(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityNone)
	svc.MaxLifetime = 10 * time.Minute
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 1),
		affinitytest.WithEngineOptions(affinity.WithMaxRequestLifetime(time.Hour)))
	e := newEnvWith(t, f, f.Engine)

	open := func() func() {
		st, cancel := e.open(t, "web")
		if resp := roundTrip(t, st, reqHeaders("GET", "/events", true)); destination(resp) == "" {
			t.Fatalf("request_headers answer without a destination: %v", resp)
		}
		if resp := roundTrip(t, st, respHeaders("200", "", false, "content-type", "text/event-stream")); resp.GetResponseHeaders() == nil {
			t.Fatalf("response_headers answer: %v", resp)
		}
		old := st
		return func() {
			// After the reset Envoy closes the side stream.
			resp, err := old.Recv()
			if err != nil || resp.GetImmediateResponse().GetStatus().GetCode() != 504 {
				t.Errorf("expired stream got %v, %v; want an ImmediateResponse 504", resp, err)
			}
			cancel()
		}
	}
	expired := open()
	f.Clock.Advance(5 * time.Minute)
	open() // a younger stream, within its limit
	if n := requestsInFlight(t, f, "web"); n != 2 {
		t.Fatalf("%d requests in flight, want 2", n)
	}

	f.Clock.Advance(5*time.Minute + time.Second) // the first stream is past its maxLifetime
	testutil.Eventually(t, "the expired stream reset", func() bool { return e.srv.Stats().ExchangesExpired == 1 })
	if n := requestsInFlight(t, f, "web"); n != 2 {
		t.Errorf("%d requests in flight right after the reset, want 2: the slot is freed when the stream ends", n)
	}
	expired() // Envoy closes the side stream
	testutil.Eventually(t, "the expired stream's slot freed", func() bool { return requestsInFlight(t, f, "web") == 1 })
	if n := e.srv.Stats().ExchangesExpired; n != 1 {
		t.Errorf("ExchangesExpired = %d, want 1 (the young stream is within its limit)", n)
	}
}
