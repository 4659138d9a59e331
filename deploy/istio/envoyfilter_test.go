// Package istio holds the Istio recipes; deploy/recipetest decodes them into Istio's, the
// Inference Extension's and Kubernetes' types (a module of its own), this test holds the Envoy
// configuration inside the EnvoyFilter to what tether itself generates.
package istio_test

import (
	"encoding/json"
	"os"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tether-dev/tether/pkg/envoyvalidate"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// patchValue decodes the value of configPatches[i] strictly (protojson refuses unknown fields)
// into an Envoy type, resolving every Any through the extensions pkg/envoyvalidate links.
func patchValue(t *testing.T, patches []any, i int, into proto.Message) {
	t.Helper()
	p, _ := patches[i].(map[string]any)
	patch, _ := p["patch"].(map[string]any)
	js, err := json.Marshal(patch["value"])
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(js, into); err != nil {
		t.Fatalf("configPatches[%d] value does not decode strictly into %T: %v", i, into, err)
	}
}

// TestEnvoyFilterIsTethersOwnConfig: the HTTP filter patch is exactly tether's generated
// ext_proc filter (modes, timeout, fail closed, metadata, attributes) except for Istio's cluster
// name and the service named in the initial metadata; the cluster patch's
// load_balancing_policy is exactly the override_host policy tether generates for a round-robin
// service. Both pass every Envoy validation rule.
func TestEnvoyFilterIsTethersOwnConfig(t *testing.T) {
	data, err := os.ReadFile("envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	spec, _ := doc["spec"].(map[string]any)
	patches, _ := spec["configPatches"].([]any)
	if len(patches) != 3 {
		t.Fatalf("%d configPatches, want 3", len(patches))
	}

	var filter hcmv3.HttpFilter
	patchValue(t, patches, 0, &filter)
	if err := envoyvalidate.ValidateResources(&filter); err != nil {
		t.Fatal(err)
	}
	var got extprocv3.ExternalProcessor
	if err := filter.GetTypedConfig().UnmarshalTo(&got); err != nil {
		t.Fatal(err)
	}
	want := xds.ExternalProcessor(xds.Params{})
	want.GrpcService = &corev3.GrpcService{
		TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "outbound|9002||tether.tether-system.svc.cluster.local"}},
		InitialMetadata: []*corev3.HeaderValue{{Key: wire.ServiceMetadataKey, Value: "web"}},
	}
	if d := cmp.Diff(want, &got, protocmp.Transform()); d != "" {
		t.Errorf("ext_proc filter differs from tether's own (-tether +recipe):\n%s", d)
	}

	var cluster clusterv3.Cluster
	patchValue(t, patches, 1, &cluster)
	if err := envoyvalidate.ValidateResources(cluster.GetLoadBalancingPolicy()); err != nil {
		t.Fatal(err)
	}
	own, err := xds.Cluster(registry.Service{Name: "web", Balancing: registry.BalanceRoundRobin}, xds.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(own.GetLoadBalancingPolicy(), cluster.GetLoadBalancingPolicy(), protocmp.Transform()); d != "" {
		t.Errorf("load_balancing_policy differs from tether's own (-tether +recipe):\n%s", d)
	}

	// The ext_proc cluster patch: exactly the circuit breakers and health check of tether's
	// own bootstrap's ext_proc cluster (which follows wire.FilterContract).
	var epc clusterv3.Cluster
	patchValue(t, patches, 2, &epc)
	if err := envoyvalidate.ValidateResources(&clusterv3.Cluster{Name: "x", CircuitBreakers: epc.GetCircuitBreakers(), HealthChecks: epc.GetHealthChecks()}); err != nil {
		t.Fatal(err)
	}
	b, err := xds.Bootstrap([]registry.Service{{Name: "web"}}, xds.BootstrapParams{XDSAddress: "127.0.0.1:18000", ExtProcAddress: "127.0.0.1:9002"})
	if err != nil {
		t.Fatal(err)
	}
	var boot *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == xds.ExtProcClusterName {
			boot = c
		}
	}
	want3 := &clusterv3.Cluster{CircuitBreakers: boot.GetCircuitBreakers(), HealthChecks: boot.GetHealthChecks()}
	if d := cmp.Diff(want3, &epc, protocmp.Transform()); d != "" {
		t.Errorf("ext_proc cluster patch differs from tether's bootstrap (-tether +recipe):\n%s", d)
	}
	fc := wire.FilterContract()
	if hc := epc.GetHealthChecks(); len(hc) != 1 || hc[0].GetGrpcHealthCheck().GetServiceName() != fc.HealthCheck.Service ||
		epc.GetCircuitBreakers().GetThresholds()[0].GetMaxRequests().GetValue() != fc.CircuitBreakerLimit {
		t.Errorf("ext_proc cluster patch %v does not carry the filter contract's health check and breakers", &epc)
	}
}
