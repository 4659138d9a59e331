package grpc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/ringhash"
	"github.com/tether-dev/tether/pkg/xds"
)

// ringFromEDS reads a ClusterLoadAssignment as grpc-go 1.85 does for a ring_hash cluster
// (xdsresource's EDS parser, the cds balancer's priorities): localities of weight 0 ignored;
// per priority, endpoints whose health is neither HEALTHY nor UNKNOWN off the ring; the ring of
// the first priority with an endpoint on it. It returns the ring and each ring index's address.
func ringFromEDS(t *testing.T, cla *endpointv3.ClusterLoadAssignment) (*ringhash.Ring, []string) {
	t.Helper()
	byPrio := map[uint32][]ringhash.Locality{}
	addrs := map[uint32][]string{}
	var prios []uint32
	for _, l := range cla.GetEndpoints() {
		if l.GetLoadBalancingWeight().GetValue() == 0 {
			continue
		}
		loc := ringhash.Locality{Weight: l.GetLoadBalancingWeight().GetValue()}
		for _, ep := range l.GetLbEndpoints() {
			sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
			addr := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			hs := ep.GetHealthStatus()
			loc.Endpoints = append(loc.Endpoints, ringhash.Endpoint{Key: addr, Weight: ep.GetLoadBalancingWeight().GetValue(),
				Skip: hs != corev3.HealthStatus_HEALTHY && hs != corev3.HealthStatus_UNKNOWN})
			addrs[l.GetPriority()] = append(addrs[l.GetPriority()], addr)
		}
		if !slices.Contains(prios, l.GetPriority()) {
			prios = append(prios, l.GetPriority())
		}
		byPrio[l.GetPriority()] = append(byPrio[l.GetPriority()], loc)
	}
	slices.Sort(prios)
	for _, p := range prios {
		r, err := ringhash.New(byPrio[p], ringhash.MinRingSize, ringhash.MaxRingSize)
		if err == nil {
			return r, addrs[p]
		}
	}
	return nil, nil
}

// TestRingMirrorFollowsEDS: the engine's mirror (Engine.GRPCRingLookup) is built from the
// registry by the same rules by which pkg/xds writes the ClusterLoadAssignment gRPC clients
// get: over 300 random instance sets (weights, zones, active/draining/standby, healthy/
// unhealthy/unchecked, SIP-only instances, duplicate addresses), 100 keys each, the instance
// the mirror names is the one at the address grpc-go's reading of tether's EDS resource picks.
func TestRingMirrorFollowsEDS(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 1))
	states := []registry.State{registry.StateActive, registry.StateActive, registry.StateDraining, registry.StateStandby}
	health := []registry.Health{registry.HealthUnknown, registry.HealthHealthy, registry.HealthHealthy, registry.HealthUnhealthy}
	zones := []string{"", "a", "b"}
	sets, compared := 0, 0
	for set := range 300 {
		n := 1 + rng.IntN(8)
		var ins []registry.Instance
		for i := range n {
			in := registry.Instance{Service: "web", ID: fmt.Sprintf("i%d", i), Address: "10.0.0." + strconv.Itoa(1+rng.IntN(4)),
				HTTPPort: 8000 + rng.IntN(3), Weight: uint32(1 + rng.IntN(5)), State: states[rng.IntN(len(states))],
				Health: health[rng.IntN(len(health))], Zone: zones[rng.IntN(len(zones))]}
			if rng.IntN(10) == 0 {
				in.HTTPPort, in.SIPPort = 0, 5060
			}
			ins = append(ins, in)
		}
		f := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityNone)}, ins, affinitytest.WithoutRun())
		ring, addrs := ringFromEDS(t, xds.ClusterLoadAssignment("web", ins))
		for k := range 100 {
			key := fmt.Sprintf("s%d-k%d", set, k)
			got, err := f.Engine.GRPCRingLookup(context.Background(), "web", key)
			if ring == nil {
				if err == nil {
					t.Fatalf("set %d (%v): no endpoint on the EDS ring, the mirror names %s", set, ins, got.ID)
				}
				break
			}
			if err != nil {
				t.Fatalf("set %d (%v): %v", set, ins, err)
			}
			h, _ := ringhash.RequestHash(xds.DefaultSessionHeader, []string{key})
			if want := addrs[ring.Pick(h)]; got.HTTPAddr() != want {
				t.Fatalf("set %d (%v), key %q: the mirror names %s (%s), tether's EDS read as grpc-go reads it picks %s", set, ins, key, got.ID, got.HTTPAddr(), want)
			}
			compared++
		}
		sets++
	}
	t.Logf("%d instance sets, %d keys compared", sets, compared)
}
