package xds

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/registry"
)

// DefaultSessionHeader is the header gRPC clients hash on when a service names no HeaderField.
const DefaultSessionHeader = "x-tether-session"

// grpcService builds the api_listener and cluster of one service for a gRPC client; see
// GRPCResources.
func grpcService(svc registry.Service) (*listenerv3.Listener, *clusterv3.Cluster, error) {
	if svc.Name == "" {
		return nil, nil, fmt.Errorf("grpc: service has no name")
	}
	router, err := toAny(&routerv3.Router{})
	if err != nil {
		return nil, nil, err
	}
	header := svc.HeaderField
	if header == "" {
		header = DefaultSessionHeader
	}
	route := &routev3.RouteConfiguration{
		Name: svc.Name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    svc.Name,
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Name:  svc.Name,
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: svc.Name},
					HashPolicy: []*routev3.RouteAction_HashPolicy{{
						PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: header}},
					}},
				}},
			}},
		}},
	}

	hcm, err := toAny(&hcmv3.HttpConnectionManager{
		StatPrefix:     svc.Name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: route},
		HttpFilters:    []*hcmv3.HttpFilter{{Name: routerFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, nil, err
	}
	listener := &listenerv3.Listener{Name: svc.Name, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}

	ring, err := typedExtension(ringHashPolicyName, &ringhashv3.RingHash{
		HashFunction:    ringhashv3.RingHash_XX_HASH,
		MinimumRingSize: wrapperspb.UInt64(1024),
	})
	if err != nil {
		return nil, nil, err
	}
	cluster := &clusterv3.Cluster{
		Name:                 svc.Name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   adsConfigSource(),
			ServiceName: svc.Name,
		},
		LoadBalancingPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{TypedExtensionConfig: ring}}},
		CircuitBreakers:     highCircuitBreakers(),
	}
	return listener, cluster, nil
}
