package xds

import (
	"fmt"
	"net/netip"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Listener builds the managed data-plane listener served over LDS: ListenerName on
// p.ListenerAddress with an HTTP connection manager whose routes (RouteConfigName) come over
// RDS on the ADS stream. See httpConnectionManager for the connection manager's settings.
func Listener(p Params) (*listenerv3.Listener, error) {
	hcm, err := httpConnectionManager(p)
	if err != nil {
		return nil, err
	}
	hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
		ConfigSource:    adsConfigSource(),
		RouteConfigName: RouteConfigName,
	}}
	return listenerWith(p, hcm)
}

// staticListener is Listener with the route table inline, for a bootstrap whose listener
// tether does not manage.
func staticListener(p Params, routes *routev3.RouteConfiguration) (*listenerv3.Listener, error) {
	hcm, err := httpConnectionManager(p)
	if err != nil {
		return nil, err
	}
	hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: routes}
	return listenerWith(p, hcm)
}

func listenerWith(p Params, hcm *hcmv3.HttpConnectionManager) (*listenerv3.Listener, error) {
	p = p.withDefaults()
	host, port, err := hostPort(p.ListenerAddress)
	if err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil, fmt.Errorf("listener address %q: host must be an IP literal", p.ListenerAddress)
	}
	a, err := toAny(hcm)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name:    ListenerName,
		Address: socketAddress(host, port),
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{Name: hcmFilterName, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}},
		}},
	}, nil
}

// httpConnectionManager is the data-plane connection manager:
//
//   - early header mutation removes any client-supplied DestinationHeader before routing and
//     before ext_proc runs, so only tether can name an instance (defence in depth: tether's
//     ext_proc answer overwrites the header anyway, and override_host reads tether's dynamic
//     metadata first);
//   - HTTP filters: ext_proc (ExternalProcessor), then the router;
//   - use_remote_address: the downstream address ext_proc sees (source.address) is the TCP
//     peer, not a client-controlled X-Forwarded-For;
//   - strip_any_host_port: virtual host domains are matched without the port;
//   - normalize_path and merge_slashes: path-prefix routing cannot be dodged with "//" or
//     "/./" tricks.
//
// The caller sets the route specifier.
func httpConnectionManager(p Params) (*hcmv3.HttpConnectionManager, error) {
	p = p.withDefaults()
	extProc, err := extProcFilter(p)
	if err != nil {
		return nil, err
	}
	router, err := toAny(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	strip, err := typedExtension(earlyHeaderMutationName, &headermutationv3.HeaderMutation{
		Mutations: []*mutationrulesv3.HeaderMutation{{Action: &mutationrulesv3.HeaderMutation_Remove{Remove: p.DestinationHeader}}},
	})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpConnectionManager{
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		StatPrefix: "tether",
		HttpFilters: []*hcmv3.HttpFilter{
			extProc,
			{Name: routerFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}},
		},
		EarlyHeaderMutationExtensions: []*corev3.TypedExtensionConfig{strip},
		UseRemoteAddress:              wrapperspb.Bool(true),
		StripPortMode:                 &hcmv3.HttpConnectionManager_StripAnyHostPort{StripAnyHostPort: true},
		NormalizePath:                 wrapperspb.Bool(true),
		MergeSlashes:                  true,
	}, nil
}
