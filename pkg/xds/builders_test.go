package xds_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	lbcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/envoyvalidate"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// diffProto fails with "(-want +got)" when two protos differ.
func diffProto(t *testing.T, want, got any) {
	t.Helper()
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("mismatch (-want +got):\n%s", d)
	}
}

func unpack[T proto.Message](t *testing.T, a *anypb.Any, into T) T {
	t.Helper()
	if err := a.UnmarshalTo(into); err != nil {
		t.Fatalf("unpack %s: %v", a.GetTypeUrl(), err)
	}
	return into
}

func mustValidate(t *testing.T, msgs ...proto.Message) {
	t.Helper()
	if err := envoyvalidate.ValidateResources(msgs...); err != nil {
		t.Fatalf("generated resource does not validate:\n%v", err)
	}
}

func TestClusterOverrideHostAndFallback(t *testing.T) {
	mdKey := func(k string) *metadatav3.MetadataKey {
		return &metadatav3.MetadataKey{Key: "envoy.lb", Path: []*metadatav3.MetadataKey_PathSegment{{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: k}}}}
	}
	tests := []struct {
		name         string
		svc          registry.Service
		wantFallback string
		wantConfig   proto.Message
	}{
		{"round robin", registry.Service{Name: "web", Balancing: registry.BalanceRoundRobin}, "envoy.load_balancing_policies.round_robin", &roundrobinv3.RoundRobin{}},
		{"sticky round robin", registry.Service{Name: "web", Balancing: registry.BalanceStickyRoundRobin}, "envoy.load_balancing_policies.round_robin", &roundrobinv3.RoundRobin{}},
		{"unset balancing", registry.Service{Name: "web"}, "envoy.load_balancing_policies.round_robin", &roundrobinv3.RoundRobin{}},
		{"least request", registry.Service{Name: "web", Balancing: registry.BalanceLeastRequest}, "envoy.load_balancing_policies.least_request", &leastrequestv3.LeastRequest{}},
		{"consistent hash", registry.Service{Name: "web", Balancing: registry.BalanceConsistentHash}, "envoy.load_balancing_policies.maglev", &maglevv3.Maglev{}},
		{
			"consistent hash with bounded load", registry.Service{Name: "web", Balancing: registry.BalanceConsistentHash, HashBalanceFactor: 1.25},
			"envoy.load_balancing_policies.maglev",
			&maglevv3.Maglev{ConsistentHashingLbConfig: &lbcommonv3.ConsistentHashingLbConfig{HashBalanceFactor: wrapperspb.UInt32(125)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := xds.Cluster(tc.svc, xds.Params{})
			if err != nil {
				t.Fatal(err)
			}
			mustValidate(t, c)
			policies := c.GetLoadBalancingPolicy().GetPolicies()
			if len(policies) != 1 || policies[0].GetTypedExtensionConfig().GetName() != "envoy.load_balancing_policies.override_host" {
				t.Fatalf("policies = %v, want exactly override_host", policies)
			}
			oh := unpack(t, policies[0].GetTypedExtensionConfig().GetTypedConfig(), &overridehostv3.OverrideHost{})
			fb := oh.GetFallbackPolicy().GetPolicies()
			if len(fb) != 1 {
				t.Fatalf("fallback policies = %v", fb)
			}
			if got := fb[0].GetTypedExtensionConfig().GetName(); got != tc.wantFallback {
				t.Errorf("fallback = %q, want %q", got, tc.wantFallback)
			}
			got, err := fb[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			diffProto(t, tc.wantConfig, got)
			oh.FallbackPolicy = nil
			diffProto(t, &overridehostv3.OverrideHost{
				OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{
					{Metadata: mdKey("x-gateway-destination-endpoint")},
					{Header: "x-gateway-destination-endpoint"},
				},
				SelectedHostKey: mdKey("x-gateway-destination-endpoint-served"),
			}, oh)
		})
	}
}

func TestClusterSettings(t *testing.T) {
	t.Run("EDS over ADS, connect timeout, breakers, HTTP/1.1 by default", func(t *testing.T) {
		c, err := xds.Cluster(registry.Service{Name: "web", ConnectTimeout: 3 * time.Second}, xds.Params{})
		if err != nil {
			t.Fatal(err)
		}
		if c.GetType() != clusterv3.Cluster_EDS {
			t.Errorf("type = %v, want EDS", c.GetType())
		}
		diffProto(t, &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3},
			ServiceName: "web",
		}, c.GetEdsClusterConfig())
		if got := c.GetConnectTimeout().AsDuration(); got != 3*time.Second {
			t.Errorf("connect timeout = %v, want 3s", got)
		}
		if len(c.GetTypedExtensionProtocolOptions()) != 0 {
			t.Errorf("HTTP/1.1 service has protocol options %v", c.GetTypedExtensionProtocolOptions())
		}
		th := c.GetCircuitBreakers().GetThresholds()
		if len(th) != 2 {
			t.Fatalf("thresholds = %v, want DEFAULT and HIGH", th)
		}
		for _, x := range th {
			for name, v := range map[string]*wrapperspb.UInt32Value{"max_connections": x.GetMaxConnections(), "max_pending_requests": x.GetMaxPendingRequests(), "max_requests": x.GetMaxRequests()} {
				if v.GetValue() != xds.CircuitBreakerLimit {
					t.Errorf("%v %s = %v, want %d", x.GetPriority(), name, v, xds.CircuitBreakerLimit)
				}
			}
		}
	})
	t.Run("default connect timeout", func(t *testing.T) {
		c, err := xds.Cluster(registry.Service{Name: "web"}, xds.Params{})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.GetConnectTimeout().AsDuration(); got != xds.DefaultConnectTimeout {
			t.Errorf("connect timeout = %v, want %v", got, xds.DefaultConnectTimeout)
		}
	})
	t.Run("HTTP/2 upstream", func(t *testing.T) {
		c, err := xds.Cluster(registry.Service{Name: "web", UpstreamHTTP2: true}, xds.Params{})
		if err != nil {
			t.Fatal(err)
		}
		mustValidate(t, c)
		a, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if !ok {
			t.Fatalf("no HttpProtocolOptions in %v", c.GetTypedExtensionProtocolOptions())
		}
		opts := unpack(t, a, &httpv3.HttpProtocolOptions{})
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("protocol options = %v, want explicit HTTP/2", opts)
		}
	})
	t.Run("custom names", func(t *testing.T) {
		c, err := xds.Cluster(registry.Service{Name: "web"}, xds.Params{DestinationHeader: "x-dest", LBNamespace: "ns", ServedHostKey: "served"})
		if err != nil {
			t.Fatal(err)
		}
		oh := unpack(t, c.GetLoadBalancingPolicy().GetPolicies()[0].GetTypedExtensionConfig().GetTypedConfig(), &overridehostv3.OverrideHost{})
		src := oh.GetOverrideHostSources()
		if src[0].GetMetadata().GetKey() != "ns" || src[0].GetMetadata().GetPath()[0].GetKey() != "x-dest" || src[1].GetHeader() != "x-dest" {
			t.Errorf("sources = %v", src)
		}
		if oh.GetSelectedHostKey().GetKey() != "ns" || oh.GetSelectedHostKey().GetPath()[0].GetKey() != "served" {
			t.Errorf("selected host key = %v", oh.GetSelectedHostKey())
		}
	})
	t.Run("errors", func(t *testing.T) {
		if _, err := xds.Cluster(registry.Service{}, xds.Params{}); err == nil {
			t.Error("no error for a nameless service")
		}
		if _, err := xds.Cluster(registry.Service{Name: "web", Balancing: "random"}, xds.Params{}); err == nil {
			t.Error("no error for an unknown balancing mode")
		}
	})
}

func lbEndpoint(id, addr string, port uint32, weight uint32, status corev3.HealthStatus) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
			Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}},
		}}},
		HealthStatus:        status,
		LoadBalancingWeight: wrapperspb.UInt32(weight),
		Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"tether": {Fields: map[string]*structpb.Value{"instance": structpb.NewStringValue(id)}},
		}},
	}
}

func locality(zone string, priority, weight uint32, eps ...*endpointv3.LbEndpoint) *endpointv3.LocalityLbEndpoints {
	return &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Zone: zone}, Priority: priority, LoadBalancingWeight: wrapperspb.UInt32(weight), LbEndpoints: eps}
}

func TestClusterLoadAssignment(t *testing.T) {
	in := func(id string, port int, mod ...func(*registry.Instance)) registry.Instance {
		i := registry.Instance{Service: "web", ID: id, Address: "10.0.0.1", HTTPPort: port, Weight: 1, State: registry.StateActive, Health: registry.HealthUnknown}
		for _, m := range mod {
			m(&i)
		}
		return i
	}
	state := func(s registry.State) func(*registry.Instance) { return func(i *registry.Instance) { i.State = s } }
	health := func(h registry.Health) func(*registry.Instance) { return func(i *registry.Instance) { i.Health = h } }
	zone := func(z string) func(*registry.Instance) { return func(i *registry.Instance) { i.Zone = z } }
	weight := func(w uint32) func(*registry.Instance) { return func(i *registry.Instance) { i.Weight = w } }
	const unknown, healthy, draining = corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DRAINING

	tests := []struct {
		name      string
		instances []registry.Instance
		want      []*endpointv3.LocalityLbEndpoints
	}{
		{"no instances", nil, nil},
		{
			"health verdicts; unhealthy left out; sorted by id",
			[]registry.Instance{in("c", 3, health(registry.HealthUnhealthy)), in("b", 2, health(registry.HealthHealthy)), in("a", 1)},
			[]*endpointv3.LocalityLbEndpoints{locality("", 0, 2, lbEndpoint("a", "10.0.0.1", 1, 1, unknown), lbEndpoint("b", "10.0.0.1", 2, 1, healthy))},
		},
		{
			"draining carried as DRAINING, even when health-checked healthy",
			[]registry.Instance{in("a", 1), in("b", 2, state(registry.StateDraining), health(registry.HealthHealthy))},
			[]*endpointv3.LocalityLbEndpoints{locality("", 0, 2, lbEndpoint("a", "10.0.0.1", 1, 1, unknown), lbEndpoint("b", "10.0.0.1", 2, 1, draining))},
		},
		{
			"unhealthy draining left out",
			[]registry.Instance{in("a", 1), in("b", 2, state(registry.StateDraining), health(registry.HealthUnhealthy))},
			[]*endpointv3.LocalityLbEndpoints{locality("", 0, 1, lbEndpoint("a", "10.0.0.1", 1, 1, unknown))},
		},
		{
			"standby in priority 1",
			[]registry.Instance{in("a", 1), in("s", 9, state(registry.StateStandby))},
			[]*endpointv3.LocalityLbEndpoints{
				locality("", 0, 1, lbEndpoint("a", "10.0.0.1", 1, 1, unknown)),
				locality("", 1, 1, lbEndpoint("s", "10.0.0.1", 9, 1, unknown)),
			},
		},
		{
			"standby alone takes priority 0",
			[]registry.Instance{in("s", 9, state(registry.StateStandby)), in("a", 1, health(registry.HealthUnhealthy))},
			[]*endpointv3.LocalityLbEndpoints{locality("", 0, 1, lbEndpoint("s", "10.0.0.1", 9, 1, unknown))},
		},
		{
			"zones become localities, weights summed, zero weight counts as 1",
			[]registry.Instance{in("b1", 3, zone("b"), weight(5)), in("a1", 1, zone("a"), weight(2)), in("a2", 2, zone("a"), weight(0)), in("s", 4, zone("a"), state(registry.StateStandby), weight(7))},
			[]*endpointv3.LocalityLbEndpoints{
				locality("a", 0, 3, lbEndpoint("a1", "10.0.0.1", 1, 2, unknown), lbEndpoint("a2", "10.0.0.1", 2, 1, unknown)),
				locality("b", 0, 5, lbEndpoint("b1", "10.0.0.1", 3, 5, unknown)),
				locality("a", 1, 7, lbEndpoint("s", "10.0.0.1", 4, 7, unknown)),
			},
		},
		{
			"SIP-only instances, other services and duplicate addresses left out",
			[]registry.Instance{in("a", 1), in("dup", 1), in("sip", 0, func(i *registry.Instance) { i.SIPPort = 5060 }), {Service: "other", ID: "x", Address: "10.0.0.2", HTTPPort: 1}},
			[]*endpointv3.LocalityLbEndpoints{locality("", 0, 1, lbEndpoint("a", "10.0.0.1", 1, 1, unknown))},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := xds.ClusterLoadAssignment("web", tc.instances)
			mustValidate(t, got)
			diffProto(t, &endpointv3.ClusterLoadAssignment{ClusterName: "web", Endpoints: tc.want}, got)
		})
	}
}

func TestExternalProcessorWireContract(t *testing.T) {
	got := xds.ExternalProcessor(xds.Params{MessageTimeout: 750 * time.Millisecond})
	mustValidate(t, got)
	ns := func() *extprocv3.MetadataOptions_MetadataNamespaces {
		return &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: []string{"envoy.lb"}}
	}
	diffProto(t, &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "tether_ext_proc"}},
			RetryPolicy: &corev3.RetryPolicy{RetryOn: "connect-failure,refused-stream,unavailable", NumRetries: wrapperspb.UInt32(2),
				RetryBackOff: &corev3.BackoffStrategy{BaseInterval: durationpb.New(25 * time.Millisecond), MaxInterval: durationpb.New(250 * time.Millisecond)}}},
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
			ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
			RequestBodyMode:     extprocv3.ProcessingMode_NONE,
			ResponseBodyMode:    extprocv3.ProcessingMode_NONE,
			RequestTrailerMode:  extprocv3.ProcessingMode_SKIP,
			ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
		},
		AllowModeOverride: true,
		MessageTimeout:    durationpb.New(750 * time.Millisecond),
		FailureModeAllow:  false,
		StatusOnError:     &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
		MetadataOptions:   &extprocv3.MetadataOptions{ReceivingNamespaces: ns(), ForwardingNamespaces: ns()},
		RequestAttributes: []string{"source.address", "source.port", "request.id"},
	}, got)
	if d := xds.ExternalProcessor(xds.Params{}).GetMessageTimeout().AsDuration(); d != 500*time.Millisecond {
		t.Errorf("default message_timeout = %v, want 500ms", d)
	}
}

func route(t *testing.T, vh *routev3.VirtualHost) []string {
	t.Helper()
	var names []string
	for _, r := range vh.GetRoutes() {
		names = append(names, r.GetName()+" "+r.GetMatch().GetPrefix())
	}
	return names
}

func TestRouteConfiguration(t *testing.T) {
	svc := func(name, prefix string, authorities ...string) registry.Service {
		return registry.Service{Name: name, Match: registry.Match{PathPrefix: prefix, Authorities: authorities}}
	}
	type vhost struct {
		Name    string
		Domains []string
		Routes  []string
	}
	tests := []struct {
		name     string
		services []registry.Service
		want     []vhost
	}{
		{"one any-host service", []registry.Service{svc("web", "")}, []vhost{{"*", []string{"*"}, []string{"web /"}}}},
		{
			"longest prefix first",
			[]registry.Service{svc("web", "/"), svc("api", "/api"), svc("apiv2", "/api/v2")},
			[]vhost{{"*", []string{"*"}, []string{"apiv2 /api/v2", "api /api", "web /"}}},
		},
		{
			"authorities share a virtual host when their routes are equal; any-host routes follow specific ones",
			[]registry.Service{svc("web", "/"), svc("api", "/", "API.example.com", "api2.example.com"), svc("mcp", "/mcp", "mcp.example.com")},
			[]vhost{
				{"api.example.com", []string{"api.example.com", "api2.example.com"}, []string{"api /", "web /"}},
				{"mcp.example.com", []string{"mcp.example.com"}, []string{"mcp /mcp", "web /"}},
				{"*", []string{"*"}, []string{"web /"}},
			},
		},
		{
			"overlapping authority sets never repeat a domain",
			[]registry.Service{svc("a", "/a", "x.test", "y.test"), svc("b", "/b", "y.test"), svc("c", "/", "*")},
			[]vhost{
				{"x.test", []string{"x.test"}, []string{"a /a", "c /"}},
				{"y.test", []string{"y.test"}, []string{"a /a", "b /b", "c /"}},
				{"*", []string{"*"}, []string{"c /"}},
			},
		},
		{
			"an authority named like a virtual host",
			[]registry.Service{svc("a", "/", "any"), svc("w", "/")},
			[]vhost{{"any", []string{"any"}, []string{"a /", "w /"}}, {"*", []string{"*"}, []string{"w /"}}},
		},
		{"no any-host service: no * virtual host", []registry.Service{svc("api", "/", "api.test")}, []vhost{{"api.test", []string{"api.test"}, []string{"api /"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := xds.RouteConfiguration("routes", tc.services)
			if err != nil {
				t.Fatal(err)
			}
			mustValidate(t, rc)
			var got []vhost
			for _, vh := range rc.GetVirtualHosts() {
				got = append(got, vhost{vh.GetName(), vh.GetDomains(), route(t, vh)})
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("virtual hosts (-want +got):\n%s", d)
			}
		})
	}
}

func TestRoutePerServiceSettings(t *testing.T) {
	rc, err := xds.RouteConfiguration("routes", []registry.Service{
		{Name: "sse", Match: registry.Match{PathPrefix: "/sse"}, MaxLifetime: 2 * time.Hour},
		{Name: "web"},
	})
	if err != nil {
		t.Fatal(err)
	}
	routes := rc.GetVirtualHosts()[0].GetRoutes()
	for _, r := range routes {
		t.Run(r.GetName(), func(t *testing.T) {
			a := r.GetRoute()
			if a.GetCluster() != r.GetName() {
				t.Errorf("cluster = %q", a.GetCluster())
			}
			if a.GetTimeout() == nil || a.GetTimeout().AsDuration() != 0 || a.GetIdleTimeout() == nil || a.GetIdleTimeout().AsDuration() != 0 {
				t.Errorf("timeout = %v, idle_timeout = %v; want both explicitly 0 (disabled)", a.GetTimeout(), a.GetIdleTimeout())
			}
			wantMax := map[string]time.Duration{"sse": 2 * time.Hour}[r.GetName()]
			if got := a.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration(); got != wantMax {
				t.Errorf("max_stream_duration = %v, want %v", got, wantMax)
			}
			if wantMax == 0 && a.GetMaxStreamDuration() != nil {
				t.Errorf("max_stream_duration set without MaxLifetime: %v", a.GetMaxStreamDuration())
			}
			if got := r.GetMetadata().GetFilterMetadata()["tether"].GetFields()["service"].GetStringValue(); got != r.GetName() {
				t.Errorf("route metadata service = %q", got)
			}
			per := unpack(t, r.GetTypedPerFilterConfig()["envoy.filters.http.ext_proc"], &extprocv3.ExtProcPerRoute{})
			diffProto(t, xds.ExtProcPerRoute(r.GetName()), per)
			md := per.GetOverrides().GetGrpcInitialMetadata()
			if len(md) != 1 || md[0].GetKey() != "x-tether-service" || md[0].GetValue() != r.GetName() {
				t.Errorf("grpc_initial_metadata = %v", md)
			}
		})
	}
}

func TestListenerConnectionManager(t *testing.T) {
	l, err := xds.Listener(xds.Params{ListenerAddress: "127.0.0.1:8080"})
	if err != nil {
		t.Fatal(err)
	}
	mustValidate(t, l)
	if sa := l.GetAddress().GetSocketAddress(); sa.GetAddress() != "127.0.0.1" || sa.GetPortValue() != 8080 {
		t.Errorf("address = %v", sa)
	}
	hcm := unpack(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	if rds := hcm.GetRds(); rds.GetRouteConfigName() != xds.RouteConfigName || rds.GetConfigSource().GetAds() == nil {
		t.Errorf("rds = %v, want %s over ADS", rds, xds.RouteConfigName)
	}
	var filters []string
	for _, f := range hcm.GetHttpFilters() {
		filters = append(filters, f.GetName())
	}
	if d := cmp.Diff([]string{"envoy.filters.http.ext_proc", "envoy.filters.http.router"}, filters); d != "" {
		t.Errorf("http filters (-want +got):\n%s", d)
	}
	diffProto(t, xds.ExternalProcessor(xds.Params{}), unpack(t, hcm.GetHttpFilters()[0].GetTypedConfig(), &extprocv3.ExternalProcessor{}))
	if !hcm.GetUseRemoteAddress().GetValue() || !hcm.GetStripAnyHostPort() || !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() {
		t.Errorf("hcm = use_remote_address %v strip_any_host_port %v normalize_path %v merge_slashes %v", hcm.GetUseRemoteAddress(), hcm.GetStripAnyHostPort(), hcm.GetNormalizePath(), hcm.GetMergeSlashes())
	}
	early := hcm.GetEarlyHeaderMutationExtensions()
	if len(early) != 1 || !strings.Contains(early[0].GetTypedConfig().String(), "x-gateway-destination-endpoint") {
		t.Errorf("early header mutation = %v, want removal of x-gateway-destination-endpoint", early)
	}

	for _, bad := range []string{"localhost:80", "0.0.0.0", "1.2.3.4:0"} {
		if _, err := xds.Listener(xds.Params{ListenerAddress: bad}); err == nil {
			t.Errorf("listener address %q: no error", bad)
		}
	}
}

func TestGRPCResources(t *testing.T) {
	reg := registry.New()
	if err := reg.Apply([]registry.Service{{Name: "echo", HeaderField: "x-session"}, {Name: "plain"}}, []registry.Instance{
		{Service: "echo", ID: "a", Address: "127.0.0.1", HTTPPort: 1001, Weight: 1, State: registry.StateActive},
	}); err != nil {
		t.Fatal(err)
	}
	rs, err := xds.GRPCResources(reg.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rs.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := envoyvalidate.ValidateSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"echo", "plain"} {
		if rs.Listeners[i].GetName() != name || rs.Listeners[i].GetApiListener() == nil {
			t.Errorf("listener %d = %v, want api_listener %q", i, rs.Listeners[i], name)
		}
		hcm := unpack(t, rs.Listeners[i].GetApiListener().GetApiListener(), &hcmv3.HttpConnectionManager{})
		hp := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetHashPolicy()
		want := map[string]string{"echo": "x-session", "plain": xds.DefaultSessionHeader}[name]
		if len(hp) != 1 || hp[0].GetHeader().GetHeaderName() != want {
			t.Errorf("%s hash policy = %v, want header %q", name, hp, want)
		}
		if got := rs.Clusters[i].GetLoadBalancingPolicy().GetPolicies()[0].GetTypedExtensionConfig().GetName(); got != "envoy.load_balancing_policies.ring_hash" {
			t.Errorf("%s lb policy = %q", name, got)
		}
		if n := len(hcm.GetHttpFilters()); n != 1 {
			t.Errorf("%s: %d HTTP filters without GRPCExtProcTarget, want the router only", name, n)
		}
	}

	// With GRPCExtProcTarget every listener runs tether's ext_proc filter, in gRPC's form,
	// before the router (deploy/grpc runs it in grpc-go).
	const target = "dns:///tether.test:9002"
	rs, err = xds.Resources(xds.Profile{Kind: xds.KindGRPC, Params: xds.Params{GRPCExtProcTarget: target}}, reg.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if snap, err = rs.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if err := envoyvalidate.ValidateSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	for _, l := range rs.Listeners {
		hcm := unpack(t, l.GetApiListener().GetApiListener(), &hcmv3.HttpConnectionManager{})
		fs := hcm.GetHttpFilters()
		if len(fs) != 2 || fs[0].GetName() != "envoy.filters.http.ext_proc" || fs[1].GetName() != "envoy.filters.http.router" {
			t.Fatalf("%s filters = %v, want ext_proc then router", l.GetName(), fs)
		}
		got := unpack(t, fs[0].GetTypedConfig(), &extprocv3.ExternalProcessor{})
		diffProto(t, xds.GRPCExternalProcessor(l.GetName(), target), got)
		if got.GetGrpcService().GetGoogleGrpc().GetTargetUri() != target || got.GetGrpcService().GetEnvoyGrpc() != nil {
			t.Errorf("%s grpc_service = %v, want google_grpc %s (gRPC refuses envoy_grpc)", l.GetName(), got.GetGrpcService(), target)
		}
	}
}

func TestBootstrapYAMLRoundTrip(t *testing.T) {
	svcs := []registry.Service{{Name: "web"}, {Name: "api", Match: registry.Match{Authorities: []string{"api.test"}}}}
	bp := xds.BootstrapParams{XDSAddress: "127.0.0.1:18000", ExtProcAddress: "127.0.0.1:9002"}
	first, err := xds.BootstrapYAML(svcs, bp)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		again, err := xds.BootstrapYAML(svcs, bp)
		if err != nil {
			t.Fatal(err)
		}
		if string(again) != string(first) {
			t.Fatal("BootstrapYAML is not deterministic")
		}
	}
	parsed, err := envoyvalidate.ParseBootstrap(first)
	if err != nil {
		t.Fatal(err)
	}
	want, err := xds.Bootstrap(svcs, bp)
	if err != nil {
		t.Fatal(err)
	}
	diffProto(t, want, parsed)
	if err := envoyvalidate.ValidateBootstrap(parsed, envoyvalidate.WithClusters("web", "api")); err != nil {
		t.Fatal(err)
	}
	if _, err := xds.Bootstrap(svcs, xds.BootstrapParams{XDSAddress: "127.0.0.1:18000"}); err == nil {
		t.Error("no error without an ext_proc address")
	}
}

func TestSnapshotVersionsFollowContent(t *testing.T) {
	build := func(timeout time.Duration, port int) map[string]string {
		t.Helper()
		reg := registry.New()
		if err := reg.Apply([]registry.Service{{Name: "web", ConnectTimeout: timeout}}, []registry.Instance{
			{Service: "web", ID: "a", Address: "127.0.0.1", HTTPPort: port, Weight: 1, State: registry.StateActive},
		}); err != nil {
			t.Fatal(err)
		}
		rs, err := xds.Build(reg.Snapshot(), xds.Params{ManagedListeners: true})
		if err != nil {
			t.Fatal(err)
		}
		s, err := rs.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if err := envoyvalidate.ValidateSnapshot(s, envoyvalidate.WithClusters(xds.ExtProcClusterName)); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, typ := range []string{"cluster", "endpoint", "listener", "route"} {
			url := map[string]string{
				"cluster":  "type.googleapis.com/envoy.config.cluster.v3.Cluster",
				"endpoint": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
				"listener": "type.googleapis.com/envoy.config.listener.v3.Listener",
				"route":    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
			}[typ]
			out[typ] = s.GetVersion(url)
		}
		return out
	}
	base := build(time.Second, 8080)
	if d := cmp.Diff(base, build(time.Second, 8080)); d != "" {
		t.Errorf("equal content, different versions:\n%s", d)
	}
	moved := build(time.Second, 8081)
	retimed := build(2*time.Second, 8080)
	for typ, changed := range map[string][2]bool{ // [endpoint port changed, connect timeout changed]
		"cluster": {false, true}, "endpoint": {true, false}, "listener": {false, false}, "route": {false, false},
	} {
		if (moved[typ] != base[typ]) != changed[0] || (retimed[typ] != base[typ]) != changed[1] {
			t.Errorf("%s version: base %s, port changed %s, timeout changed %s; want changes %v", typ, base[typ], moved[typ], retimed[typ], changed)
		}
	}
}

// endpointsByPriority lists a static cluster's "priority:ip:port" endpoints.
func endpointsByPriority(c *clusterv3.Cluster) []string {
	var out []string
	for _, l := range c.GetLoadAssignment().GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, fmt.Sprintf("%d:%s", l.GetPriority(), net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))))
		}
	}
	return out
}

func TestBootstrapReplicas(t *testing.T) {
	svcs := []registry.Service{{Name: "web"}}
	replicas := []xds.Replica{
		{XDSAddress: "10.0.0.1:18000", ExtProcAddress: "10.0.0.1:9002"},
		{XDSAddress: "[2001:DB8::2]:18000", ExtProcAddress: "[2001:db8::2]:9002"},
		{XDSAddress: "10.0.0.3:18000", ExtProcAddress: "10.0.0.3:9002"},
	}
	for _, tc := range []struct {
		name         string
		standby      bool
		xds, extProc []string
	}{
		{"active-active", false,
			[]string{"0:10.0.0.1:18000", "0:[2001:db8::2]:18000", "0:10.0.0.3:18000"},
			[]string{"0:10.0.0.1:9002", "0:[2001:db8::2]:9002", "0:10.0.0.3:9002"}},
		{"active-standby", true,
			[]string{"0:10.0.0.1:18000", "1:[2001:db8::2]:18000", "1:10.0.0.3:18000"},
			[]string{"0:10.0.0.1:9002", "1:[2001:db8::2]:9002", "1:10.0.0.3:9002"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bp := xds.BootstrapParams{Replicas: replicas, Standby: tc.standby}
			y, err := xds.BootstrapYAML(svcs, bp)
			if err != nil {
				t.Fatal(err)
			}
			b, err := envoyvalidate.ParseBootstrap(y)
			if err != nil {
				t.Fatal(err)
			}
			if err := envoyvalidate.ValidateBootstrap(b, envoyvalidate.WithClusters("web")); err != nil {
				t.Fatal(err)
			}
			clusters := map[string]*clusterv3.Cluster{}
			for _, c := range b.GetStaticResources().GetClusters() {
				clusters[c.GetName()] = c
			}
			for name, want := range map[string]struct {
				eps []string
				hc  string
			}{xds.XDSClusterName: {tc.xds, xds.XDSServiceName}, xds.ExtProcClusterName: {tc.extProc, wire.ExtProcServiceName}} {
				c := clusters[name]
				if d := cmp.Diff(want.eps, endpointsByPriority(c)); d != "" {
					t.Errorf("%s endpoints (-want +got):\n%s", name, d)
				}
				if hc := c.GetHealthChecks(); len(hc) != 1 || hc[0].GetGrpcHealthCheck().GetServiceName() != want.hc {
					t.Errorf("%s health checks = %v, want gRPC %q", name, hc, want.hc)
				}
				od := c.GetOutlierDetection()
				if od.GetConsecutiveLocalOriginFailure().GetValue() == 0 || !od.GetSplitExternalLocalOriginErrors() || od.GetMaxEjectionPercent().GetValue() != 50 {
					t.Errorf("%s outlier detection = %v", name, od)
				}
			}
		})
	}
	t.Run("one replica keeps the single-replica clusters", func(t *testing.T) {
		one, err := xds.Bootstrap(svcs, xds.BootstrapParams{Replicas: replicas[:1], Standby: true})
		if err != nil {
			t.Fatal(err)
		}
		plain, err := xds.Bootstrap(svcs, xds.BootstrapParams{XDSAddress: replicas[0].XDSAddress, ExtProcAddress: replicas[0].ExtProcAddress})
		if err != nil {
			t.Fatal(err)
		}
		diffProto(t, plain, one)
	})
	for name, bad := range map[string][]xds.Replica{
		"unspecified host": {replicas[0], {XDSAddress: "0.0.0.0:18000", ExtProcAddress: "10.0.0.9:9002"}},
		"no host":          {replicas[0], {XDSAddress: "10.0.0.9:18000", ExtProcAddress: ":9002"}},
		"listed twice":     {replicas[0], {XDSAddress: "10.0.0.1:18000", ExtProcAddress: "10.0.0.9:9002"}},
		"no address":       {replicas[0], {ExtProcAddress: "10.0.0.9:9002"}},
	} {
		if _, err := xds.Bootstrap(svcs, xds.BootstrapParams{Replicas: bad}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
