package mcpe2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/e2e"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestStreamSlotsSeparateFromRequests: four Go SDK sessions on one replica each open their
// standalone SSE GET stream, which they keep idle. The service has 2 stream slots and 2 request
// slots per instance: two GETs hold the stream slots (the others are refused 429, which the
// SDK tolerates), and every session's tool calls still get request slots — idle listeners do
// not eat the request slots. Closing the sessions frees every slot.
func TestStreamSlotsSeparateFromRequests(t *testing.T) {
	e2e.ForEachKind(t, testStreamSlotsSeparateFromRequests)
}

func testStreamSlotsSeparateFromRequests(t *testing.T, kind e2e.Kind) {
	reps := startGoReplicas(t, mcpreplica.Options{}, "sa")
	svc := mcpService("mcp", registry.AffinityMCPStreamable, 10)
	svc.StreamsPerInstance, svc.RequestSlotsPerInstance = 2, 2
	e := newEnv(t, kind, []registry.Service{svc}, instancesOf("mcp", goReplicas(reps)...))
	logReplicasOnFailure(t, reps)
	ctx := testContext(t, 45*time.Second)
	streams := func() (int, int) {
		us, err := e.fx.Engine.Usage("mcp")
		if err != nil {
			t.Fatal(err)
		}
		return us[0].Streams, us[0].Requests
	}
	var calls int
	for i := range 4 {
		cs, err := connectStreamable(ctx, fmt.Sprintf("listener-%d", i), e.URL, nil, v20251125)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		closeAtEnd(t, cs)
		if i == 1 {
			testutil.Eventually(t, "two idle GET streams hold the stream slots", func() bool {
				s, _ := streams()
				return s == 2
			})
		}
		for range 3 {
			if _, err := call(ctx, cs, "whoami"); err != nil {
				t.Fatalf("client %d: a tool call beside %d idle streams: %v", i, 2, err)
			}
			calls++
		}
	}
	// The last call's exchange ends just after its response reached the client.
	testutil.Eventually(t, "after the calls: 2 streams held and no request in flight", func() bool {
		s, r := streams()
		return s == 2 && r == 0
	})
	if calls != 12 {
		t.Errorf("%d tool calls served, want 12", calls)
	}
}
