package affinity_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// grpcCall is a call of a proxyless gRPC client (Request.GRPCRing) carrying key in the session
// header, or no header when key is "".
func grpcCall(service, key string) affinity.Request {
	kv := []string{}
	if key != "" {
		kv = []string{wire.DefaultSessionHeader, key}
	}
	r := affinitytest.HTTP(service, "POST", "/grpc.health.v1.Health/Check", kv...)
	r.GRPCRing = true
	return r
}

// keysOn returns the first n keys the ring sends to each instance.
func keysOn(t *testing.T, e *affinity.Engine, service string, n int) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i := range 50 * n {
		k := fmt.Sprintf("key-%d", i)
		in, err := e.GRPCRingLookup(context.Background(), service, k)
		if err != nil {
			t.Fatal(err)
		}
		if len(out[in.ID]) < n {
			out[in.ID] = append(out[in.ID], k)
		}
	}
	return out
}

// TestGRPCRingDecidesOnTheRingsPick: a proxyless gRPC call is admitted on, and counted on, the
// instance the client's ring picks for its session header (GRPCRingLookup), never where tether
// would have balanced it; when that instance's request slots are full the call is refused
// (ResourceExhausted naming it) even though other instances have room; without the header the
// pick is unknowable (the client hashes at random) and tether balances as usual.
func TestGRPCRingDecidesOnTheRingsPick(t *testing.T) {
	ctx := context.Background()
	svc := affinitytest.Service("web", registry.AffinityNone)
	svc.RequestSlotsPerInstance = 2
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 3))
	on := keysOn(t, f.Engine, "web", 3)
	if len(on) != 3 {
		t.Fatalf("keys reach %d instances, want 3: %v", len(on), on)
	}
	var open []affinity.Decision
	defer func() {
		for _, d := range open {
			d.End()
		}
	}()
	for _, k := range on["i1"][:2] {
		d, err := f.Engine.Decide(ctx, grpcCall("web", k))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if d.Instance().ID != "i1" {
			t.Errorf("%s: decided on %s, want the ring's i1", k, d.Instance().ID)
		}
		open = append(open, d)
	}
	_, err := f.Engine.Decide(ctx, grpcCall("web", on["i1"][2]))
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Code != "ResourceExhausted" || !strings.Contains(rej.Message, `"i1"`) {
		t.Errorf("a third call the ring sends to the full i1: %v, want ResourceExhausted naming i1", err)
	}
	d, err := f.Engine.Decide(ctx, grpcCall("web", on["i2"][0]))
	if err != nil || d.Instance().ID != "i2" {
		t.Fatalf("a call the ring sends to i2: %v, %v; want i2", d, err)
	}
	open = append(open, d)
	if u := f.Usage(t, "web"); u["i1"][1] != 2 || u["i2"][1] != 1 || u["i3"][1] != 0 {
		t.Errorf("requests counted %v, want i1:2 i2:1 i3:0", u)
	}
	// No header: balanced by tether (round robin among instances with room).
	d, err = f.Engine.Decide(ctx, grpcCall("web", ""))
	if err != nil || d.Instance().ID == "i1" {
		t.Fatalf("a call without the session header: %v, %v; want an instance with room", d, err)
	}
	open = append(open, d)
}

// TestGRPCRingRebindsHeaderSessions: on a header-affinity service a proxyless call's session
// lives where the ring sends its id: a new session is placed there, and a session tether had
// placed elsewhere (e.g. for a call through Envoy) is rebound to the ring's instance.
func TestGRPCRingRebindsHeaderSessions(t *testing.T) {
	ctx := context.Background()
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("hdr", registry.AffinityHeader)}, affinitytest.Instances("hdr", 3))
	for i := range 20 {
		id := fmt.Sprintf("session-%d", i)
		ring, err := f.Engine.GRPCRingLookup(ctx, "hdr", id)
		if err != nil {
			t.Fatal(err)
		}
		var first affinity.Decision
		if i%2 == 0 { // placed by tether first, then called by the gRPC client
			first, err = f.Engine.Decide(ctx, affinitytest.HTTP("hdr", "GET", "/", wire.DefaultSessionHeader, id))
			if err != nil {
				t.Fatal(err)
			}
			first.End()
		}
		d, err := f.Engine.Decide(ctx, grpcCall("hdr", id))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if d.Instance().ID != ring.ID {
			t.Errorf("%s: decided on %s, want the ring's %s", id, d.Instance().ID, ring.ID)
		}
		d.End()
		s, err := f.Store.Get(ctx, "hdr", id)
		if err != nil || s.Instance != ring.ID {
			t.Errorf("%s: stored on %q (%v), want %s", id, s.Instance, err, ring.ID)
		}
	}
}

// BenchmarkDecideGRPCRing: a sessionless call decided and ended over 10 instances, by tether's
// round robin (tether) and on the pick of the gRPC ring mirror (ring: the header hashed, the
// ring searched, the service limited to the picked instance); run side by side, the ratio is
// the mirror's cost per call.
func BenchmarkDecideGRPCRing(b *testing.B) {
	svc := affinitytest.Service("fn", registry.AffinityNone)
	svc.RequestSlotsPerInstance = 10000
	f := affinitytest.New(b, []registry.Service{svc}, affinitytest.Instances("fn", 10), affinitytest.WithoutRun())
	keys := make([]affinity.Request, 1000)
	for i := range keys {
		keys[i] = grpcCall("fn", fmt.Sprintf("session-%d", i))
	}
	for _, ring := range []bool{false, true} {
		name := "tether"
		if ring {
			name = "ring"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			i := 0
			for b.Loop() {
				r := keys[i%len(keys)]
				r.GRPCRing = ring
				d, err := f.Engine.Decide(ctx, r)
				if err != nil {
					b.Fatal(err)
				}
				d.End()
				i++
			}
		})
	}
}

// TestGRPCRingOnStandby: with its only active instance draining, a gRPC client's ring is that
// of priority 1, the standby instance; tether does not start sessionless work on a standby
// instance (as for any data plane), so the call the ring sends there is refused NoCapacity
// naming it.
func TestGRPCRingOnStandby(t *testing.T) {
	ins := affinitytest.Instances("web", 2)
	ins[0].State, ins[1].State = registry.StateDraining, registry.StateStandby
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, ins)
	in, err := f.Engine.GRPCRingLookup(context.Background(), "web", "k")
	if err != nil || in.ID != "i2" {
		t.Fatalf("ring pick %v, %v; want the standby i2 (priority 1)", in.ID, err)
	}
	_, err = f.Engine.Decide(context.Background(), grpcCall("web", "k"))
	var rej *affinity.Reject
	if !errors.As(err, &rej) || rej.Code != "NoCapacity" || !strings.Contains(rej.Message, `"i2"`) {
		t.Errorf("Decide: %v, want NoCapacity naming i2", err)
	}
}
