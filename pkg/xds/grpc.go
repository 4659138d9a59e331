package xds

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/ringhash"
	"github.com/tether-dev/tether/pkg/wire"
)

// DefaultSessionHeader is the header gRPC clients hash on when a service names no HeaderField.
const DefaultSessionHeader = wire.DefaultSessionHeader

// GRPCExtProcStatPrefix is the stat_prefix of the gRPC profile's google_grpc service (required
// by the API; gRPC clients ignore it).
const GRPCExtProcStatPrefix = "tether_ext_proc"

// GRPCExternalProcessor builds the ext_proc HTTP filter of a proxyless gRPC client (gRFC A93)
// for one service's listener, in the form gRPC accepts:
//
//   - grpc_service google_grpc with target_uri target (gRPC's filter refuses envoy_grpc) and no
//     credentials: per gRFC A102 a client takes the side channel's credentials from its own
//     bootstrap's allowed_grpc_services entry for exactly this target (deploy/grpc), so tether's
//     xDS can never point a client's calls at another server;
//   - initial_metadata naming the service (ServiceMetadataKey; gRPC sends no :authority or
//     :path) and the data plane (wire.DataPlaneMetadataKey: grpc), so tether answers
//     rejections with a gRPC status and the code in the message;
//   - processing mode: the filter contract's (wire.FilterContract GRPCMode): request and response
//     headers and response trailers SEND, bodies NONE (gRPC supports only NONE and GRPC
//     bodies; request trailers do not exist there); the stream then lasts until the call ends;
//   - failure_mode_allow false: a call tether cannot decide fails (INTERNAL) instead of
//     reaching an instance unaccounted;
//   - request_attributes: ExtProcGRPCRequestAttributes.
//
// gRPC ignores message_timeout, status_on_error, metadata_options and dynamic metadata, so
// none are set.
func GRPCExternalProcessor(service, target string) *extprocv3.ExternalProcessor {
	fc := wire.FilterContract()
	return &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_GoogleGrpc_{GoogleGrpc: &corev3.GrpcService_GoogleGrpc{
				TargetUri: target, StatPrefix: GRPCExtProcStatPrefix,
			}},
			InitialMetadata: []*corev3.HeaderValue{
				{Key: wire.ServiceMetadataKey, Value: service},
				{Key: wire.DataPlaneMetadataKey, Value: wire.DataPlaneGRPC},
			},
		},
		ProcessingMode:    processingMode(fc.GRPCMode),
		FailureModeAllow:  fc.FailureModeAllow,
		RequestAttributes: fc.GRPCRequestAttributes,
	}
}

// ExtProcGRPCRequestAttributes are the request attributes a gRPC client's filter sends:
// request.path (the full method) and request.host (the channel's authority), which tether
// reads in place of the :path and :authority pseudo headers gRPC does not send. gRPC has no
// source.* attributes.
func ExtProcGRPCRequestAttributes() []string { return wire.FilterContract().GRPCRequestAttributes }

// grpcService builds the api_listener and cluster of one service for a gRPC client; see
// GRPCResources. With p.GRPCExtProcTarget the listener runs GRPCExternalProcessor before the
// router.
func grpcService(svc registry.Service, p Params) (*listenerv3.Listener, *clusterv3.Cluster, error) {
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

	filters := []*hcmv3.HttpFilter{{Name: routerFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}}
	if p.GRPCExtProcTarget != "" {
		ep, err := toAny(GRPCExternalProcessor(svc.Name, p.GRPCExtProcTarget))
		if err != nil {
			return nil, nil, err
		}
		filters = append([]*hcmv3.HttpFilter{{Name: extProcFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: ep}}}, filters...)
	}
	hcm, err := toAny(&hcmv3.HttpConnectionManager{
		StatPrefix:     svc.Name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: route},
		HttpFilters:    filters,
	})
	if err != nil {
		return nil, nil, err
	}
	listener := &listenerv3.Listener{Name: svc.Name, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}

	// The ring sizes are grpc-go's defaults, stated so that the engine's mirror of the ring
	// (package ringhash) does not depend on them.
	ring, err := typedExtension(ringHashPolicyName, &ringhashv3.RingHash{
		HashFunction:    ringhashv3.RingHash_XX_HASH,
		MinimumRingSize: wrapperspb.UInt64(ringhash.MinRingSize),
		MaximumRingSize: wrapperspb.UInt64(ringhash.MaxRingSize),
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
