package xds

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// RouteConfiguration builds the data-plane route table named name: one route per service,
// matched by path prefix, grouped into virtual hosts by authority.
//
// Virtual hosts: a service with authorities answers those host names (ports are stripped by
// the connection manager); a service without authorities (or with "*") answers any host. For every
// authority the virtual host holds the routes of the services naming it plus those of the
// any-host services (a request for that authority must still reach them); authorities whose
// route lists are identical share one virtual host (named after its first authority), and the
// any-host services alone form the virtual host "*" (a name no authority group can take). Within a virtual host routes are ordered longest prefix first, then services
// with authorities before any-host services, then by name, so the most specific route wins.
//
// Every route: cluster = service name; timeout 0 and idle_timeout 0 (disabled: MCP and SSE
// streams stay open for hours, and the stream idle timeout of the connection manager would
// otherwise cut them after 5 minutes); max_stream_duration = MaxLifetime when set; metadata
// tether/service; and an ExtProcPerRoute override that names the service to tether
// (ServiceMetadataKey) and, for a service with FullDuplexBodies, sets the processing mode to
// wire.FullDuplexProcessingMode. services may be in any order; it is not modified.
func RouteConfiguration(name string, services []registry.Service) (*routev3.RouteConfiguration, error) {
	routes := make(map[string]*routev3.Route, len(services))
	byDomain := map[string][]registry.Service{}
	var anyHost []registry.Service
	for _, svc := range services {
		r, err := serviceRoute(svc)
		if err != nil {
			return nil, err
		}
		routes[svc.Name] = r
		if isAnyHost(svc) {
			anyHost = append(anyHost, svc)
			continue
		}
		for _, a := range svc.Match.Authorities {
			d := strings.ToLower(a)
			if !slices.ContainsFunc(byDomain[d], func(s registry.Service) bool { return s.Name == svc.Name }) {
				byDomain[d] = append(byDomain[d], svc)
			}
		}
	}

	// Group domains by their ordered route list.
	type group struct {
		domains []string
		svcs    []registry.Service
	}
	groups := map[string]*group{}
	for _, d := range slices.Sorted(maps.Keys(byDomain)) {
		svcs := orderRoutes(append(slices.Clone(byDomain[d]), anyHost...))
		k := routeKey(svcs)
		if g, ok := groups[k]; ok {
			g.domains = append(g.domains, d)
		} else {
			groups[k] = &group{domains: []string{d}, svcs: svcs}
		}
	}
	var vhosts []*routev3.VirtualHost
	for _, g := range groups {
		vhosts = append(vhosts, virtualHost(g.domains[0], g.domains, g.svcs, routes))
	}
	slices.SortFunc(vhosts, func(a, b *routev3.VirtualHost) int { return cmp.Compare(a.Name, b.Name) })
	if len(anyHost) > 0 {
		vhosts = append(vhosts, virtualHost("*", []string{"*"}, orderRoutes(anyHost), routes))
	}
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: vhosts}, nil
}

func routeKey(svcs []registry.Service) string {
	names := make([]string, len(svcs))
	for i, s := range svcs {
		names[i] = s.Name
	}
	return strings.Join(names, "\x00")
}

func orderRoutes(svcs []registry.Service) []registry.Service {
	slices.SortFunc(svcs, func(a, b registry.Service) int {
		return cmp.Or(
			-cmp.Compare(len(pathPrefix(a)), len(pathPrefix(b))),
			cmp.Compare(boolInt(isAnyHost(a)), boolInt(isAnyHost(b))),
			cmp.Compare(a.Name, b.Name),
		)
	})
	return svcs
}

// isAnyHost reports whether the service answers every authority: none listed, or "*".
func isAnyHost(svc registry.Service) bool {
	return len(svc.Match.Authorities) == 0 || slices.Contains(svc.Match.Authorities, "*")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func virtualHost(name string, domains []string, svcs []registry.Service, routes map[string]*routev3.Route) *routev3.VirtualHost {
	vh := &routev3.VirtualHost{Name: name, Domains: domains}
	for _, s := range svcs {
		vh.Routes = append(vh.Routes, routes[s.Name])
	}
	return vh
}

func pathPrefix(svc registry.Service) string {
	if svc.Match.PathPrefix == "" {
		return "/"
	}
	return svc.Match.PathPrefix
}

func serviceRoute(svc registry.Service) (*routev3.Route, error) {
	if svc.Name == "" {
		return nil, fmt.Errorf("route: service has no name")
	}
	per := ExtProcPerRoute(svc.Name)
	if svc.FullDuplexBodies { // services[].bodyMode full-duplex: bodies stream through tether
		per.GetOverrides().ProcessingMode = processingMode(wire.FullDuplexProcessingMode())
	}
	perRoute, err := toAny(per)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", svc.Name, err)
	}
	action := &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: svc.Name},
		Timeout:          durationpb.New(0),
		IdleTimeout:      durationpb.New(0),
	}
	if svc.MaxLifetime > 0 {
		action.MaxStreamDuration = &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: durationpb.New(svc.MaxLifetime)}
	}
	return &routev3.Route{
		Name:   svc.Name,
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: pathPrefix(svc)}},
		Action: &routev3.Route_Route{Route: action},
		Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			wire.MetadataNamespace: {Fields: map[string]*structpb.Value{"service": structpb.NewStringValue(svc.Name)}},
		}},
		TypedPerFilterConfig: map[string]*anypb.Any{extProcFilterName: perRoute},
	}, nil
}
