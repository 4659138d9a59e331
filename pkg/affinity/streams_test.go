package affinity_test

import (
	"errors"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// streamUsage returns an instance's [streams, requests] in use.
func streamUsage(t *testing.T, f *affinitytest.Fixture, service, id string) [2]int {
	t.Helper()
	us, err := f.Engine.Usage(service)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if u.Instance.ID == id {
			return [2]int{u.Streams, u.Requests}
		}
	}
	t.Fatalf("no instance %s", id)
	return [2]int{}
}

// TestStreamSlots: long-lived MCP streams — a session's SSE GET stream, a subscriptions/listen
// POST (with a session, or sessionless) — take the service's stream slots, not its request
// slots, so idle listeners cannot use up the request slots; at the stream cap a new stream is
// refused 429 StreamSlotsExhausted while ordinary requests still go through, and ending a
// stream frees its slot.
func TestStreamSlots(t *testing.T) {
	svc := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	svc.StreamsPerInstance, svc.RequestSlotsPerInstance = 2, 2
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("mcp", 1))
	initMCP(t, f, "S1")

	get := mustDecide(t, f, mcpReq("GET", "S1", "accept", "text/event-stream"))
	listen := mustDecide(t, f, mcpReq("POST", "S1", "mcp-method", "subscriptions/listen"))
	if u := streamUsage(t, f, "mcp", "i1"); u != [2]int{2, 0} {
		t.Fatalf("a GET stream and a listen POST held: [streams requests] = %v, want [2 0]", u)
	}
	_, err := f.Engine.Decide(t.Context(), mcpReq("GET", "S1"))
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Class != affinity.ClassTooManyRequests || rej.Code != "StreamSlotsExhausted" {
		t.Fatalf("a third stream at the cap of 2: %v, want TooManyRequests StreamSlotsExhausted", err)
	}
	// Ordinary requests use the request slots, all still free.
	a, b := mustDecide(t, f, mcpReq("POST", "S1")), mustDecide(t, f, mcpReq("POST", "S1"))
	if u := streamUsage(t, f, "mcp", "i1"); u != [2]int{2, 2} {
		t.Fatalf("two POSTs beside two streams: %v, want [2 2]", u)
	}
	mustReject(t, f, mcpReq("POST", "S1"), affinity.ClassTooManyRequests)
	a.End()
	b.End()
	get.End()
	again := mustDecide(t, f, mcpReq("GET", "S1"))
	if u := streamUsage(t, f, "mcp", "i1"); u != [2]int{2, 0} {
		t.Fatalf("after one stream ended and another opened: %v, want [2 0]", u)
	}
	again.End()
	listen.End()

	// A sessionless listen (MCP 2026-07-28) is a stream too.
	sl := mustDecide(t, f, mcpReq("POST", "", "mcp-protocol-version", "2026-07-28", "mcp-method", "subscriptions/listen"))
	if u := streamUsage(t, f, "mcp", "i1"); u != [2]int{1, 0} {
		t.Fatalf("a sessionless listen: %v, want [1 0]", u)
	}
	sl.End()
	if u := streamUsage(t, f, "mcp", "i1"); u != [2]int{0, 0} {
		t.Fatalf("after every exchange ended: %v, want [0 0]", u)
	}
}
