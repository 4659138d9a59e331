package recipetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	istionet "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// filterContract is tether's filter contract (pkg/wire FilterContract) as the repository
// renders it in deploy/filter-contract.json (make generate). This module does not import tether,
// whose dependencies would then have to be tidied here too; it reads the file instead.
type filterContract struct {
	AllowModeOverride     bool     `json:"allowModeOverride"`
	FailureModeAllow      bool     `json:"failureModeAllow"`
	StatusOnError         int      `json:"statusOnError"`
	MetadataNamespace     string   `json:"metadataNamespace"`
	DestinationHeader     string   `json:"destinationHeader"`
	ServedHostKey         string   `json:"servedHostKey"`
	RequestAttributes     []string `json:"requestAttributes"`
	GRPCRequestAttributes []string `json:"grpcRequestAttributes"`
	CircuitBreakerLimit   int64    `json:"circuitBreakerLimit"`
	ProcessingMode        mode     `json:"processingMode"`
	FullDuplexMode        mode     `json:"fullDuplexProcessingMode"`
	GRPCMode              mode     `json:"grpcProcessingMode"`
	MessageTimeout        string   `json:"messageTimeout"`
	HealthCheck           struct {
		Service            string `json:"service"`
		UnhealthyThreshold uint32 `json:"unhealthyThreshold"`
		HealthyThreshold   uint32 `json:"healthyThreshold"`
		Interval           string `json:"interval"`
		Timeout            string `json:"timeout"`
	} `json:"healthCheck"`
	Keepalive struct {
		Interval string `json:"interval"`
		Timeout  string `json:"timeout"`
	} `json:"keepalive"`
}

// mode is a processing mode by Envoy's enum names.
type mode struct {
	RequestHeaderMode   string `json:"requestHeaderMode"`
	ResponseHeaderMode  string `json:"responseHeaderMode"`
	RequestBodyMode     string `json:"requestBodyMode"`
	ResponseBodyMode    string `json:"responseBodyMode"`
	RequestTrailerMode  string `json:"requestTrailerMode"`
	ResponseTrailerMode string `json:"responseTrailerMode"`
}

func contract(t *testing.T) filterContract {
	t.Helper()
	data, err := os.ReadFile("../filter-contract.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var fc filterContract
	if err := dec.Decode(&fc); err != nil {
		t.Fatalf("filter-contract.json: %v", err)
	}
	return fc
}

// istioEnvoyFilter is an EnvoyFilter object whose spec is decoded separately, with protojson:
// Istio's generated UnmarshalJSON accepts unknown fields, protojson does not.
type istioEnvoyFilter struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              json.RawMessage `json:"spec"`
}

// kinds maps apiVersion/kind to a new value of the project's own type.
var kinds = map[string]func() any{
	"gateway.envoyproxy.io/v1alpha1/Backend":              func() any { return &egv1a1.Backend{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy": func() any { return &egv1a1.EnvoyExtensionPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy": func() any { return &egv1a1.BackendTrafficPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy":  func() any { return &egv1a1.ClientTrafficPolicy{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":              func() any { return &gwapiv1.HTTPRoute{} },
	"inference.networking.k8s.io/v1/InferencePool":        func() any { return &giev1.InferencePool{} },
	"v1/Service": func() any { return &corev1.Service{} },
	"networking.istio.io/v1alpha3/EnvoyFilter": func() any { return &istioEnvoyFilter{} },
}

// load decodes every document of a recipe file strictly (unknown or duplicate fields fail) into
// its type, keyed by kind/name.
func load(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 0; ; i++ {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		doc, err := yaml.Marshal(&n)
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		mk, ok := kinds[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s: document %d: no Go type known for %s %s", path, i, tm.APIVersion, tm.Kind)
		}
		obj := mk()
		if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %s document %d does not decode strictly: %v", path, tm.Kind, i, err)
		}
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		out[tm.Kind+"/"+meta.Metadata.Name] = obj
	}
	if len(out) == 0 {
		t.Fatalf("%s: no documents", path)
	}
	return out
}

func get[T any](t *testing.T, objs map[string]any, key string) T {
	t.Helper()
	v, ok := objs[key].(T)
	if !ok {
		t.Fatalf("no %s in the recipe (have %v)", key, keys(objs))
	}
	return v
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestEnvoyGatewayRecipe: ext_proc in full-duplex streamed mode both ways (the only way Envoy
// Gateway turns response trailers on), fail closed, envoy.lb writable and forwarded, reaching
// tether's ext_proc port through the Backend; the endpoint override reads tether's destination
// header; both policies target the route in the file.
func TestEnvoyGatewayRecipe(t *testing.T) {
	objs := load(t, "../envoy-gateway/tether.yaml")
	fc := contract(t)
	lbNamespace, destinationHeader, requestAttributes := fc.MetadataNamespace, fc.DestinationHeader, fc.RequestAttributes
	route := get[*gwapiv1.HTTPRoute](t, objs, "HTTPRoute/web")
	backend := get[*egv1a1.Backend](t, objs, "Backend/tether-ext-proc")
	eep := get[*egv1a1.EnvoyExtensionPolicy](t, objs, "EnvoyExtensionPolicy/tether")
	btp := get[*egv1a1.BackendTrafficPolicy](t, objs, "BackendTrafficPolicy/tether-endpoint-override")

	if d := cmp.Diff([]egv1a1.AppProtocolType{egv1a1.AppProtocolTypeH2C}, backend.Spec.AppProtocols); d != "" {
		t.Errorf("Backend app protocols (-want +got):\n%s", d)
	}
	if len(backend.Spec.Endpoints) != 1 || backend.Spec.Endpoints[0].FQDN == nil || backend.Spec.Endpoints[0].FQDN.Port != 9002 {
		t.Errorf("Backend endpoints = %+v, want tether's ext_proc port 9002", backend.Spec.Endpoints)
	}
	for name, refs := range map[string][]gwapiv1.LocalPolicyTargetReferenceWithSectionName{"EnvoyExtensionPolicy": eep.Spec.TargetRefs, "BackendTrafficPolicy": btp.Spec.TargetRefs} {
		if len(refs) != 1 || refs[0].Kind != "HTTPRoute" || string(refs[0].Name) != route.Name {
			t.Errorf("%s targets %+v, want HTTPRoute %s", name, refs, route.Name)
		}
	}
	if len(eep.Spec.ExtProc) != 1 {
		t.Fatalf("extProc = %+v, want one", eep.Spec.ExtProc)
	}
	ep := eep.Spec.ExtProc[0]
	if len(ep.BackendRefs) != 1 || string(ep.BackendRefs[0].Name) != backend.Name || ep.BackendRefs[0].Kind == nil || *ep.BackendRefs[0].Kind != egv1a1.KindBackend {
		t.Errorf("extProc backendRefs = %+v, want Backend %s", ep.BackendRefs, backend.Name)
	}
	full := egv1a1.FullDuplexStreamedExtBodyProcessingMode
	pm := ep.ProcessingMode
	if pm == nil || pm.Request == nil || pm.Response == nil || pm.Request.Body == nil || *pm.Request.Body != full || pm.Response.Body == nil || *pm.Response.Body != full {
		t.Errorf("processingMode = %+v, want FullDuplexStreamed request and response bodies", pm)
	}
	if ep.FailOpen == nil || *ep.FailOpen || ep.StatusOnError == nil || *ep.StatusOnError != 503 {
		t.Errorf("failOpen %v statusOnError %v, want fail closed with 503", ep.FailOpen, ep.StatusOnError)
	}
	if m := ep.Metadata; m == nil || !slices.Contains(m.WritableNamespaces, lbNamespace) || !slices.Contains(m.AccessibleNamespaces, lbNamespace) {
		t.Errorf("metadata = %+v, want %s writable and accessible", ep.Metadata, lbNamespace)
	}
	if d := cmp.Diff(requestAttributes, pm.Request.Attributes); d != "" {
		t.Errorf("request attributes (-tether's +recipe):\n%s", d)
	}
	lb := btp.Spec.LoadBalancer
	if lb == nil || lb.EndpointOverride == nil || len(lb.EndpointOverride.ExtractFrom) != 1 || lb.EndpointOverride.ExtractFrom[0].Header == nil ||
		*lb.EndpointOverride.ExtractFrom[0].Header != destinationHeader {
		t.Errorf("loadBalancer = %+v, want endpointOverride from header %s", lb, destinationHeader)
	}

	// Routing stays Endpoint: with Service the cluster holds the cluster IP and every override
	// falls back silently.
	if rt := btp.Spec.RoutingType; rt == nil || *rt != egv1a1.EndpointRoutingType {
		t.Errorf("routingType = %v, want Endpoint", rt)
	}
	// Circuit breakers above Envoy's default 1,024 on both clusters, the ext_proc cluster's
	// gRPC health check and HTTP/2 keepalive (the values are held to tether's own in the root
	// module's deploy/envoy-gateway test).
	bs := ep.BackendSettings
	if bs == nil {
		t.Fatal("extProc backendSettings missing")
	}
	for name, cb := range map[string]*egv1a1.CircuitBreaker{"ext_proc": bs.CircuitBreaker, "backend": btp.Spec.CircuitBreaker} {
		if cb == nil || cb.MaxConnections == nil || cb.MaxPendingRequests == nil || cb.MaxParallelRequests == nil ||
			*cb.MaxConnections <= 1024 || *cb.MaxPendingRequests <= 1024 || *cb.MaxParallelRequests <= 1024 {
			t.Errorf("%s circuitBreaker = %+v, want connections, pending and parallel requests above 1024", name, cb)
		}
	}
	if hc := bs.HealthCheck; hc == nil || hc.Active == nil || hc.Active.Type != egv1a1.ActiveHealthCheckerTypeGRPC || hc.Active.GRPC == nil || hc.Active.GRPC.Service == nil {
		t.Errorf("ext_proc healthCheck = %+v, want an active GRPC check naming a service", hc)
	}
	if h2 := bs.HTTP2; h2 == nil || h2.ConnectionKeepalive == nil || h2.ConnectionKeepalive.Interval == nil || h2.ConnectionKeepalive.Timeout == nil {
		t.Errorf("ext_proc http2 = %+v, want connectionKeepalive interval and timeout", h2)
	}
	// The client's copy of the destination header is removed early, on the route's Gateway.
	ctp := get[*egv1a1.ClientTrafficPolicy](t, objs, "ClientTrafficPolicy/tether-strip-destination")
	if refs := ctp.Spec.TargetRefs; len(refs) != 1 || refs[0].Kind != "Gateway" || string(refs[0].Name) != string(route.Spec.ParentRefs[0].Name) {
		t.Errorf("ClientTrafficPolicy targets %+v, want the route's Gateway %s", refs, route.Spec.ParentRefs[0].Name)
	}
	if h := ctp.Spec.Headers; h == nil || h.EarlyRequestHeaders == nil || !slices.Equal(h.EarlyRequestHeaders.Remove, []string{destinationHeader}) {
		t.Errorf("ClientTrafficPolicy headers = %+v, want earlyRequestHeaders.remove [%s]", h, destinationHeader)
	}
}

// TestRecipesStartWithAnObject: no recipe file opens with a comment-only YAML document.
// kubectl skips an empty document; Envoy Gateway's loader (egctl) and other strict loaders
// decode it as an object without apiVersion and kind, and refuse the file.
func TestRecipesStartWithAnObject(t *testing.T) {
	for _, path := range []string{"../envoy-gateway/tether.yaml", "../istio/envoyfilter.yaml", "../istio/inferencepool.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			content := false
			for _, line := range bytes.Split(doc, []byte("\n")) {
				if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' && !bytes.Equal(l, []byte("---")) {
					content = true
					break
				}
			}
			if !content {
				t.Errorf("%s: document %d holds only comments", path, i)
			}
		}
	}
}

// TestIstioEnvoyFilterRecipe: the EnvoyFilter decodes strictly into Istio's EnvoyFilter: an
// HTTP filter inserted before the router, a MERGE on the backend's cluster and one on tether's
// ext_proc cluster, all on the ingress gateway. (deploy/istio's own test holds the patch values to tether's builders.)
func TestIstioEnvoyFilterRecipe(t *testing.T) {
	objs := load(t, "../istio/envoyfilter.yaml")
	ef := get[*istioEnvoyFilter](t, objs, "EnvoyFilter/tether")
	var spec istionet.EnvoyFilter
	if err := protojson.Unmarshal(ef.Spec, &spec); err != nil {
		t.Fatalf("spec does not decode strictly into Istio's EnvoyFilter: %v", err)
	}
	if len(spec.GetConfigPatches()) != 3 {
		t.Fatalf("%d patches, want 3", len(spec.GetConfigPatches()))
	}
	fp, cp, ep := spec.GetConfigPatches()[0], spec.GetConfigPatches()[1], spec.GetConfigPatches()[2]
	if ep.GetApplyTo() != istionet.EnvoyFilter_CLUSTER || ep.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_MERGE ||
		ep.GetMatch().GetCluster().GetService() != "tether.tether-system.svc.cluster.local" || ep.GetMatch().GetCluster().GetPortNumber() != 9002 {
		t.Errorf("ext_proc cluster patch = %v, want MERGE on tether's ext_proc CLUSTER (port 9002)", ep)
	}

	if fp.GetApplyTo() != istionet.EnvoyFilter_HTTP_FILTER || fp.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_INSERT_BEFORE ||
		fp.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
		t.Errorf("filter patch = %v, want INSERT_BEFORE the router", fp)
	}
	if cp.GetApplyTo() != istionet.EnvoyFilter_CLUSTER || cp.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_MERGE ||
		cp.GetMatch().GetCluster().GetService() == "" {
		t.Errorf("cluster patch = %v, want MERGE on a service's CLUSTER", cp)
	}
	for i, p := range spec.GetConfigPatches() {
		if p.GetMatch().GetContext() != istionet.EnvoyFilter_GATEWAY || p.GetPatch().GetValue() == nil {
			t.Errorf("patch %d: context %v, value %v; want GATEWAY with a value", i, p.GetMatch().GetContext(), p.GetPatch().GetValue())
		}
	}
	if spec.GetWorkloadSelector().GetLabels()["istio"] != "ingressgateway" {
		t.Errorf("workloadSelector = %v, want the ingress gateway", spec.GetWorkloadSelector())
	}
}

// TestInferencePoolRecipe: the pool names tether's picker Service and port, fails closed, and
// the route sends traffic to the pool.
func TestInferencePoolRecipe(t *testing.T) {
	objs := load(t, "../istio/inferencepool.yaml")
	svc := get[*corev1.Service](t, objs, "Service/tether-picker")
	pool := get[*giev1.InferencePool](t, objs, "InferencePool/web")
	route := get[*gwapiv1.HTTPRoute](t, objs, "HTTPRoute/web")
	ref := pool.Spec.EndpointPickerRef
	if string(ref.Name) != svc.Name || string(ref.Kind) != "Service" || ref.Port == nil {
		t.Fatalf("endpointPickerRef = %+v, want Service %s with a port", ref, svc.Name)
	}
	if len(svc.Spec.Ports) != 1 || int32(ref.Port.Number) != svc.Spec.Ports[0].Port || svc.Spec.Ports[0].Port != 9002 {
		t.Errorf("picker port %d, Service ports %+v, want tether's ext_proc port 9002 on both", ref.Port.Number, svc.Spec.Ports)
	}
	if ref.FailureMode != giev1.EndpointPickerFailClose {
		t.Errorf("failureMode = %q, want FailClose (tether fails closed)", ref.FailureMode)
	}
	if len(pool.Spec.TargetPorts) != 1 || len(pool.Spec.Selector.MatchLabels) == 0 {
		t.Errorf("pool selector %+v, target ports %+v", pool.Spec.Selector, pool.Spec.TargetPorts)
	}
	br := route.Spec.Rules[0].BackendRefs
	if len(br) != 1 || br[0].Kind == nil || string(*br[0].Kind) != "InferencePool" || string(br[0].Name) != pool.Name {
		t.Errorf("route backendRefs = %+v, want InferencePool %s", br, pool.Name)
	}
}
