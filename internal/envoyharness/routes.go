package envoyharness

import (
	"fmt"
	"net"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// VirtualHost is one virtual host of the route table: the domains it answers and its routes,
// matched in order.
type VirtualHost struct {
	Name string
	// Domains are host names without port (the generated connection manager strips ports), or
	// "*" for any; "*.suffix" and "prefix*" wildcards match as in Envoy.
	Domains []string
	Routes  []Route
}

// Route is one route: a path prefix sending to a cluster, with the ext_proc per-route override.
type Route struct {
	Name string
	// PathPrefix is the path prefix the route matches; "" matches any path.
	PathPrefix string
	// Cluster is the upstream cluster (its EDS endpoints come from the EndpointSource).
	Cluster string
	// Service, when set, is sent as gRPC initial metadata (ExtProcPerRoute.overrides.
	// grpc_initial_metadata) under the service metadata key.
	Service string
	// Disabled turns ext_proc off for the route (ExtProcPerRoute.disabled).
	Disabled bool
	// ProcessingMode, when set, replaces the filter's processing mode on this route
	// (ExtProcPerRoute.overrides.processing_mode, Filter::mergePerRouteConfig).
	ProcessingMode *extprocfilterv3.ProcessingMode
}

const extProcFilterName = "envoy.filters.http.ext_proc"

// RoutesFromConfig converts a route configuration (as tether's xDS server or bootstrap
// generates it) into the harness's route table. Only prefix matches, cluster actions and the
// ext_proc per-route override (disabled, grpc_initial_metadata serviceKey) are understood;
// anything else is an error, so a change in the generated config cannot be silently ignored.
func RoutesFromConfig(rc *routev3.RouteConfiguration, serviceKey string) ([]VirtualHost, error) {
	var out []VirtualHost
	for _, vh := range rc.GetVirtualHosts() {
		v := VirtualHost{Name: vh.GetName(), Domains: vh.GetDomains()}
		for _, r := range vh.GetRoutes() {
			var prefix string
			switch pm := r.GetMatch().GetPathSpecifier().(type) {
			case *routev3.RouteMatch_Prefix:
				prefix = pm.Prefix
			default:
				return nil, fmt.Errorf("envoyharness: route %q: only prefix matches are modelled, got %T", r.GetName(), pm)
			}
			if len(r.GetMatch().GetHeaders()) > 0 || len(r.GetMatch().GetQueryParameters()) > 0 {
				return nil, fmt.Errorf("envoyharness: route %q: header and query matchers are not modelled", r.GetName())
			}
			cluster := r.GetRoute().GetCluster()
			if cluster == "" {
				return nil, fmt.Errorf("envoyharness: route %q: only a fixed cluster action is modelled", r.GetName())
			}
			route := Route{Name: r.GetName(), PathPrefix: prefix, Cluster: cluster}
			if a, ok := r.GetTypedPerFilterConfig()[extProcFilterName]; ok {
				var per extprocfilterv3.ExtProcPerRoute
				if err := a.UnmarshalTo(&per); err != nil {
					return nil, fmt.Errorf("envoyharness: route %q: ext_proc per-route config: %w", r.GetName(), err)
				}
				route.Disabled = per.GetDisabled()
				route.ProcessingMode = per.GetOverrides().GetProcessingMode()
				for _, md := range per.GetOverrides().GetGrpcInitialMetadata() {
					if strings.EqualFold(md.GetKey(), serviceKey) {
						route.Service = md.GetValue()
						if route.Service == "" {
							route.Service = string(md.GetRawValue())
						}
					}
				}
			}
			v.Routes = append(v.Routes, route)
		}
		out = append(out, v)
	}
	return out, nil
}

// selectVirtualHost follows Envoy's domain matching: exact names first, then suffix wildcards
// (longest first), then prefix wildcards (longest first), then "*".
func selectVirtualHost(vhosts []VirtualHost, host string) *VirtualHost {
	host = strings.ToLower(host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	var best *VirtualHost
	bestRank, bestLen := 5, -1
	for i := range vhosts {
		for _, d := range vhosts[i].Domains {
			d = strings.ToLower(d)
			rank, n := 5, 0
			switch {
			case d == host:
				rank, n = 0, len(d)
			case d == "*":
				rank = 3
			case strings.HasPrefix(d, "*") && strings.HasSuffix(host, d[1:]) && len(host) > len(d)-1:
				rank, n = 1, len(d)
			case strings.HasSuffix(d, "*") && strings.HasPrefix(host, d[:len(d)-1]) && len(host) > len(d)-1:
				rank, n = 2, len(d)
			}
			if rank < bestRank || rank == bestRank && rank < 5 && n > bestLen {
				best, bestRank, bestLen = &vhosts[i], rank, n
			}
		}
	}
	return best
}

func matchRoute(vhosts []VirtualHost, host, path string) *Route {
	vh := selectVirtualHost(vhosts, host)
	if vh == nil {
		return nil
	}
	for i := range vh.Routes {
		if strings.HasPrefix(path, vh.Routes[i].PathPrefix) {
			return &vh.Routes[i]
		}
	}
	return nil
}
