package extproc_test

import (
	"context"
	"fmt"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestProxylessGRPCDecidedOnTheRingsPick: an exchange from gRPC's own ext_proc filter carrying
// tether's data-plane metadata is routed — and its slot counted — on the instance the client's
// ring picks for its session header (Engine.GRPCRingLookup), the header's values joined with ","
// as grpc-go hashes them; a filter configured elsewhere (no data-plane metadata) balances by
// tether's round robin, whose picks are not the ring's.
func TestProxylessGRPCDecidedOnTheRingsPick(t *testing.T) {
	e := newEnv(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, affinitytest.Instances("web", 3))
	ctx := context.Background()
	a93 := func(kv ...string) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(kv...),
		}}}
	}
	elsewhere := 0
	for i := range 30 {
		key := fmt.Sprintf("key-%02d", i)
		want, err := e.f.Engine.GRPCRingLookup(ctx, "web", key)
		if err != nil {
			t.Fatal(err)
		}
		st, cancel := e.open(t, "web", wire.DataPlaneMetadataKey, wire.DataPlaneGRPC)
		if got := destination(roundTrip(t, st, a93(wire.DefaultSessionHeader, key))); got != want.HTTPAddr() {
			t.Errorf("%s: routed to %s, want the ring's %s (%s)", key, got, want.ID, want.HTTPAddr())
		}
		cancel()

		st, cancel = e.open(t, "web")
		if got := destination(roundTrip(t, st, a93(wire.DefaultSessionHeader, key))); got != want.HTTPAddr() {
			elsewhere++
		}
		cancel()
	}
	if elsewhere == 0 {
		t.Error("without the data-plane metadata every call went to the ring's pick; want tether's own balancing")
	}
	// Two values of the header: grpc-go hashes them joined with ",".
	want, err := e.f.Engine.GRPCRingLookup(ctx, "web", "a,b")
	if err != nil {
		t.Fatal(err)
	}
	st, cancel := e.open(t, "web", wire.DataPlaneMetadataKey, wire.DataPlaneGRPC)
	defer cancel()
	if got := destination(roundTrip(t, st, a93(wire.DefaultSessionHeader, "a", wire.DefaultSessionHeader, "b"))); got != want.HTTPAddr() {
		t.Errorf("two header values: routed to %s, want the ring's pick for \"a,b\", %s", got, want.HTTPAddr())
	}
}
