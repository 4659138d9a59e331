package xds

import (
	"fmt"
	"math"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	lbcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// CircuitBreakerLimit is the value of max_connections, max_pending_requests and max_requests
// on every service cluster (both priorities) and on the ext_proc cluster.
//
// Envoy's defaults (1024 each) would turn the 1025th concurrent request into a local 503
// (flag UO) although tether's own admission control — request slots, at most 10,000 per
// instance, answered with 429 + Retry-After — still has room. One million is far above any
// configurable tether capacity per Envoy, so Envoy's breakers never fire first. max_retries is
// left at Envoy's default (3): tether configures no retry policy.
const CircuitBreakerLimit = wire.CircuitBreakerLimit

// Cluster builds the EDS cluster of one service.
//
// The cluster takes its endpoints over ADS (EDS resource name = service name) and balances
// with envoy.load_balancing_policies.override_host: the host named by dynamic metadata
// LBNamespace/DestinationHeader, else by the DestinationHeader request header, if that host is
// in the cluster's EDS membership; otherwise the fallback policy for svc.Balancing
// (round-robin and sticky-round-robin → round_robin, least-request → least_request,
// consistent-hash → maglev with hash_balance_factor from svc.HashBalanceFactor). The host Envoy
// actually chose is written to LBNamespace/ServedHostKey so tether can compare it with its own
// choice on response_headers.
func Cluster(svc registry.Service, p Params) (*clusterv3.Cluster, error) {
	p = p.withDefaults()
	if svc.Name == "" {
		return nil, fmt.Errorf("cluster: service has no name")
	}
	policy, err := overrideHostPolicy(svc, p)
	if err != nil {
		return nil, fmt.Errorf("cluster %q: %w", svc.Name, err)
	}
	connect := svc.ConnectTimeout
	if connect <= 0 {
		connect = DefaultConnectTimeout
	}
	c := &clusterv3.Cluster{
		Name:                 svc.Name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   adsConfigSource(),
			ServiceName: svc.Name,
		},
		ConnectTimeout:      durationpb.New(connect),
		LoadBalancingPolicy: policy,
		CircuitBreakers:     highCircuitBreakers(),
	}
	if svc.UpstreamHTTP2 {
		opts, err := http2ProtocolOptions()
		if err != nil {
			return nil, fmt.Errorf("cluster %q: %w", svc.Name, err)
		}
		c.TypedExtensionProtocolOptions = opts
	}
	return c, nil
}

// adsConfigSource is the config source "over the ADS stream, API v3".
func adsConfigSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

func highCircuitBreakers() *clusterv3.CircuitBreakers {
	t := func(p corev3.RoutingPriority) *clusterv3.CircuitBreakers_Thresholds {
		return &clusterv3.CircuitBreakers_Thresholds{
			Priority:           p,
			MaxConnections:     wrapperspb.UInt32(CircuitBreakerLimit),
			MaxPendingRequests: wrapperspb.UInt32(CircuitBreakerLimit),
			MaxRequests:        wrapperspb.UInt32(CircuitBreakerLimit),
		}
	}
	return &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{
		t(corev3.RoutingPriority_DEFAULT), t(corev3.RoutingPriority_HIGH),
	}}
}

// http2ProtocolOptions makes Envoy speak HTTP/2 (prior knowledge / h2c) to the upstream.
func http2ProtocolOptions() (map[string]*anypb.Any, error) {
	a, err := toAny(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
				},
			},
		},
	})
	if err != nil {
		return nil, err
	}
	return map[string]*anypb.Any{httpProtocolOptionsName: a}, nil
}

func overrideHostPolicy(svc registry.Service, p Params) (*clusterv3.LoadBalancingPolicy, error) {
	fallback, err := fallbackPolicy(svc)
	if err != nil {
		return nil, err
	}
	key := func(k string) *metadatav3.MetadataKey {
		return &metadatav3.MetadataKey{
			Key:  p.LBNamespace,
			Path: []*metadatav3.MetadataKey_PathSegment{{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: k}}},
		}
	}
	oh, err := typedExtension(overrideHostPolicyName, &overridehostv3.OverrideHost{
		OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{
			{Metadata: key(p.DestinationHeader)},
			{Header: p.DestinationHeader},
		},
		SelectedHostKey: key(p.ServedHostKey),
		FallbackPolicy:  fallback,
	})
	if err != nil {
		return nil, err
	}
	return &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{TypedExtensionConfig: oh}}}, nil
}

// fallbackPolicy is the policy override_host uses when tether's choice is absent or not in EDS.
func fallbackPolicy(svc registry.Service) (*clusterv3.LoadBalancingPolicy, error) {
	var (
		name string
		cfg  proto.Message
	)
	switch svc.Balancing {
	case registry.BalanceLeastRequest:
		name, cfg = leastRequestPolicyName, &leastrequestv3.LeastRequest{}
	case registry.BalanceConsistentHash:
		m := &maglevv3.Maglev{}
		if f := svc.HashBalanceFactor; f >= 1 {
			m.ConsistentHashingLbConfig = &lbcommonv3.ConsistentHashingLbConfig{
				HashBalanceFactor: wrapperspb.UInt32(uint32(math.Round(f * 100))),
			}
		}
		name, cfg = maglevPolicyName, m
	case registry.BalanceRoundRobin, registry.BalanceStickyRoundRobin, "":
		name, cfg = roundRobinPolicyName, &roundrobinv3.RoundRobin{}
	default:
		return nil, fmt.Errorf("balancing %q: %w", svc.Balancing, registry.ErrInvalid)
	}
	ext, err := typedExtension(name, cfg)
	if err != nil {
		return nil, err
	}
	return &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{TypedExtensionConfig: ext}}}, nil
}
