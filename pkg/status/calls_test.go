package status_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// TestCallsAndStreamsInTheSnapshot: the snapshot carries each instance's SIP call load (from the
// call tracker) and its MCP stream slots, and /metrics renders them from the same snapshot.
func TestCallsAndStreamsInTheSnapshot(t *testing.T) {
	voice := affinitytest.Service("voice", registry.AffinityHash)
	mcp := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	mcp.StreamsPerInstance = 7
	insts := append(affinitytest.Instances("voice", 2), affinitytest.Instances("mcp", 1)...)
	for i := range insts[:2] {
		insts[i].SIPPort = 5070 + i
	}
	f := affinitytest.New(t, []registry.Service{voice, mcp}, insts)
	tr := calls.New()
	tr.SetCap("voice", 3)
	for _, c := range []struct{ inst, id string }{{"i1", "a"}, {"i1", "b"}, {"i2", "c"}} {
		if _, err := tr.Begin("voice", c.inst, c.id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.Answered("voice", "a"); err != nil {
		t.Fatal(err)
	}
	a := status.New(f.Registry, f.Engine, status.WithCalls(tr.Loads))
	got := map[string][3]int32{}
	var streamCap int32
	for _, svc := range a.Snapshot().GetServices() {
		for _, in := range svc.GetInstances() {
			if svc.GetName() == "voice" {
				got[in.GetId()] = [3]int32{in.GetCalls(), in.GetCallsAnswered(), in.GetCallCapacity()}
			} else {
				streamCap = in.GetStreamCapacity()
			}
		}
	}
	if want := map[string][3]int32{"i1": {2, 1, 3}, "i2": {1, 0, 3}}; got["i1"] != want["i1"] || got["i2"] != want["i2"] {
		t.Errorf("calls per instance [calls answered cap] %v, want %v", got, want)
	}
	if streamCap != 7 {
		t.Errorf("stream capacity %d, want 7", streamCap)
	}
	m := status.NewMetrics(a, nil, nil)
	want := `
# HELP tether_instance_calls SIP calls the instance carries (decided, not ended), by state (setup, answered); services with calls.track.
# TYPE tether_instance_calls gauge
tether_instance_calls{state="answered",tether_instance="i1",tether_service="voice"} 1
tether_instance_calls{state="setup",tether_instance="i1",tether_service="voice"} 1
tether_instance_calls{state="answered",tether_instance="i2",tether_service="voice"} 0
tether_instance_calls{state="setup",tether_instance="i2",tether_service="voice"} 1
# HELP tether_instance_stream_slots Stream slots of the instance (streamsPerInstance); 0 where streams count as requests.
# TYPE tether_instance_stream_slots gauge
tether_instance_stream_slots{tether_instance="i1",tether_service="mcp"} 7
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "tether_instance_calls", "tether_instance_stream_slots"); err != nil {
		t.Error(err)
	}
}
