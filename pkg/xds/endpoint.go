package xds

import (
	"cmp"
	"math"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// ClusterLoadAssignment builds the EDS resource (named after the service) from the service's
// instances. instances may be in any order and may include other services' instances, which
// are ignored; the slice is not modified.
//
// Which instances are carried, and how:
//
//   - Unhealthy instances are left out. Envoy's override_host policy does not check host
//     health (it only asks "is this ip:port in the cluster?"), so leaving them out is what keeps
//     Envoy off a failed instance even if a stale decision names it; it also keeps the fallback
//     policy away from them. Instances without an HTTP port (SIP-only) are left out too.
//   - Active, draining and standby instances that are healthy (or not checked) are carried, so
//     override_host finds every instance tether may pick: draining ones still serve their
//     existing sessions, standby ones receive sessions on scale-out.
//   - Draining instances carry health_status DRAINING: Envoy excludes them from load balancing
//     (so the fallback never starts new work there) while override_host still finds them for the
//     sessions tether keeps routing to them. Active and standby instances carry HEALTHY when a
//     health check said so and UNKNOWN when no verdict exists; both are routable in Envoy and in
//     gRPC.
//   - Standby instances sit in priority 1 (priority 0 when no active or draining instance
//     exists, since priorities must be contiguous), so the fallback policy uses them only when
//     priority 0 cannot take the traffic; override_host searches all priorities.
//   - Weights become load_balancing_weight (minimum 1); each (priority, zone) pair becomes one
//     locality whose load_balancing_weight is the sum of its endpoints' weights (required by
//     gRPC, ignored by Envoy without locality-weighted balancing).
//   - Endpoint metadata tether/instance carries the instance id. Two instances with the same
//     ip:port (a misconfiguration) would be indistinguishable to override_host and are refused
//     by gRPC clients; only the one with the smallest id is carried.
//
// Localities are ordered by (priority, zone) and endpoints by instance id.
func ClusterLoadAssignment(service string, instances []registry.Instance) *endpointv3.ClusterLoadAssignment {
	ins := make([]registry.Instance, 0, len(instances))
	for _, in := range instances {
		if in.Service == service && in.Healthy() && in.HTTPPort > 0 {
			ins = append(ins, in)
		}
	}
	slices.SortFunc(ins, func(a, b registry.Instance) int { return cmp.Compare(a.ID, b.ID) })
	seen := make(map[string]bool, len(ins))
	ins = slices.DeleteFunc(ins, func(in registry.Instance) bool {
		addr := in.HTTPAddr()
		if seen[addr] {
			return true
		}
		seen[addr] = true
		return false
	})

	hasPrimary := slices.ContainsFunc(ins, func(in registry.Instance) bool { return in.State != registry.StateStandby })
	type key struct {
		priority uint32
		zone     string
	}
	groups := map[key][]*endpointv3.LbEndpoint{}
	weights := map[key]uint64{}
	for _, in := range ins {
		k := key{zone: in.Zone}
		if in.State == registry.StateStandby && hasPrimary {
			k.priority = 1
		}
		w := max(in.Weight, 1)
		groups[k] = append(groups[k], lbEndpoint(in, w))
		weights[k] += uint64(w)
	}
	keys := make([]key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), cmp.Compare(a.zone, b.zone))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: service}
	for _, k := range keys {
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: k.zone},
			LbEndpoints:         groups[k],
			LoadBalancingWeight: wrapperspb.UInt32(uint32(min(weights[k], math.MaxUint32))),
			Priority:            k.priority,
		})
	}
	return cla
}

func lbEndpoint(in registry.Instance, weight uint32) *endpointv3.LbEndpoint {
	status := corev3.HealthStatus_UNKNOWN
	switch {
	case in.State == registry.StateDraining:
		status = corev3.HealthStatus_DRAINING
	case in.Health == registry.HealthHealthy:
		status = corev3.HealthStatus_HEALTHY
	}
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: socketAddress(in.Address, uint32(in.HTTPPort)),
		}},
		HealthStatus:        status,
		LoadBalancingWeight: wrapperspb.UInt32(weight),
		Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			wire.MetadataNamespace: {Fields: map[string]*structpb.Value{"instance": structpb.NewStringValue(in.ID)}},
		}},
	}
}

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
