package envoyvalidate_test

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tether-dev/tether/pkg/envoyvalidate"
)

// overrideHostCluster is a static cluster using override_host; fallback is spliced into its
// OverrideHost config.
func overrideHostCluster(fallback string) string {
	return `
static_resources:
  clusters:
  - name: web
    type: STATIC
    load_assignment:
      cluster_name: web
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8080}}}
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-dest
` + fallback
}

const fallbackRR = `            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config: {"@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin}
`

func TestAnyWalkFindsMissingFallbackPolicy(t *testing.T) {
	bad := []byte(overrideHostCluster(""))
	b, err := envoyvalidate.ParseBootstrap(bad)
	if err != nil {
		t.Fatal(err)
	}
	// The generated validators stop at Any: the bootstrap alone looks valid...
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("Bootstrap.ValidateAll() = %v; this test needs the PGV blind spot it proves we cover", err)
	}
	// ...but the recursive walk unpacks the OverrideHost and finds the required field missing.
	err = envoyvalidate.ValidateBootstrapYAML(bad)
	if err == nil || !strings.Contains(err.Error(), "FallbackPolicy: value is required") {
		t.Fatalf("ValidateBootstrapYAML = %v, want the missing fallback_policy reported", err)
	}
	if !strings.Contains(err.Error(), "typed_config(OverrideHost)") {
		t.Errorf("error %q does not name the path into the Any", err)
	}
	if err := envoyvalidate.ValidateBootstrapYAML([]byte(overrideHostCluster(fallbackRR))); err != nil {
		t.Fatalf("with a fallback policy: %v", err)
	}
}

func TestValidateBootstrapProblems(t *testing.T) {
	const extProc = `
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, port_value: 10000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: x
          route_config:
            virtual_hosts:
            - name: any
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route: {cluster: web}
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {envoy_grpc: {cluster_name: ext}}
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
`
	const ads = `
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services: [{envoy_grpc: {cluster_name: xds}}]
  cds_config: {ads: {}, resource_api_version: V3}
`
	const typedStruct = `
static_resources:
  clusters:
  - name: web
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/xds.type.v3.TypedStruct
            type_url: type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            value:
              override_host_sources: [{header: x-dest}]
`
	tests := []struct {
		name    string
		yaml    string
		opts    []envoyvalidate.Option
		wantErr []string // substrings; nil = valid
	}{
		{"route and ext_proc clusters missing", extProc, nil, []string{
			`route.cluster: unknown cluster "web"`,
			`typed_config(ExternalProcessor).grpc_service.envoy_grpc.cluster_name: unknown cluster "ext"`,
		}},
		{"clusters declared as dynamic", extProc, []envoyvalidate.Option{envoyvalidate.WithClusters("web", "ext")}, nil},
		{"ADS cluster missing", ads, nil, []string{`dynamic_resources.ads_config.grpc_services[0].envoy_grpc.cluster_name: unknown cluster "xds"`}},
		{"typed struct is walked", typedStruct, nil, []string{"typed_config(TypedStruct)(OverrideHost)", "FallbackPolicy: value is required"}},
		{"duplicate static clusters", overrideHostCluster(fallbackRR) + strings.Replace(overrideHostCluster(fallbackRR), "static_resources:\n  clusters:\n", "", 1), nil, []string{`duplicate cluster name "web"`}},
		{"unknown field", "static_resources: {clusterz: []}", nil, []string{"clusterz"}},
		{"repeated virtual host name and domain", `
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, port_value: 10000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: x
          route_config:
            virtual_hosts:
            - {name: a, domains: [x.test]}
            - {name: a, domains: [X.test]}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
`, nil, []string{`duplicate virtual host name "a"`, `domain "X.test" in more than one virtual host`}},
		{"unregistered @type", `
static_resources:
  clusters:
  - name: c
    typed_extension_protocol_options:
      x: {"@type": type.googleapis.com/example.NotAType}
`, nil, []string{"example.NotAType"}},
		{"plain field rule", "static_resources: {clusters: [{name: ''}]}", nil, []string{"Name: value length must be at least 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := envoyvalidate.ValidateBootstrapYAML([]byte(tc.yaml), tc.opts...)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("unexpected error:\n%v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func snapshot(t *testing.T, res map[resource.Type][]types.Resource) *cache.Snapshot {
	t.Helper()
	s, err := cache.NewSnapshot("1", res)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestValidateSnapshot(t *testing.T) {
	eds := func(name string) *clusterv3.Cluster {
		return &clusterv3.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{ServiceName: name},
		}
	}
	cla := func(name string, weight uint32) *endpointv3.ClusterLoadAssignment {
		return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LoadBalancingWeight: wrapperspb.UInt32(weight),
		}}}
	}
	tests := []struct {
		name    string
		res     map[resource.Type][]types.Resource
		wantErr string
	}{
		{"valid", map[resource.Type][]types.Resource{resource.ClusterType: {eds("web")}, resource.EndpointType: {cla("web", 1)}}, ""},
		{"endpoints without cluster", map[resource.Type][]types.Resource{resource.ClusterType: {eds("web")}, resource.EndpointType: {cla("web", 1), cla("api", 1)}}, "mismatched"},
		{"field rule in a nested message", map[resource.Type][]types.Resource{resource.ClusterType: {eds("web")}, resource.EndpointType: {cla("web", 0)}}, `ClusterLoadAssignment "web"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := envoyvalidate.ValidateSnapshot(snapshot(t, tc.res))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestLooksLikeBootstrap(t *testing.T) {
	tests := map[string]bool{
		"static_resources: {}":                true,
		"node: {id: x}":                       true,
		`{"dynamic_resources": {}}`:           true,
		"apiVersion: tether/v1\nservices: []": false,
		"apiVersion: v1\nnode: {id: x}":       false,
		"services: []":                        false,
		"- a\n- b":                            false,
		"routing_script: route(DECIDE)\n":     false,
	}
	for in, want := range tests {
		if got := envoyvalidate.LooksLikeBootstrap([]byte(in)); got != want {
			t.Errorf("LooksLikeBootstrap(%q) = %v, want %v", in, got, want)
		}
	}
}
