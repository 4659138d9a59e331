package gatewayapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tether-dev/tether/internal/kubetest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/discovery"
	"github.com/tether-dev/tether/pkg/discovery/discoverytest"
	"github.com/tether-dev/tether/pkg/discovery/gatewayapi"
	"github.com/tether-dev/tether/pkg/discovery/kubernetes"
	"github.com/tether-dev/tether/pkg/registry"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

type env struct {
	t   *testing.T
	api *kubetest.Server
	ns  string
	f   *affinitytest.Fixture
}

func (e *env) do(method, path string, obj any) []byte {
	e.t.Helper()
	var body []byte
	if obj != nil {
		var err error
		if body, err = json.Marshal(obj); err != nil {
			e.t.Fatal(err)
		}
	}
	b, err := e.api.Do(context.Background(), method, path, body)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return b
}

func (e *env) routes() string {
	return "/apis/gateway.networking.k8s.io/v1/namespaces/" + e.ns + "/httproutes"
}

// newEnv starts a gateway-api source as the unprivileged user "tether" holding exactly
// RBACRules in a fresh namespace, with a GatewayClass of its own and a Gateway "gw" of it.
func newEnv(t *testing.T) *env {
	t.Helper()
	api := kubetest.Shared(t)
	api.InstallGatewayAPI(t)
	ns := api.Namespace(t, "gwapi")
	var rules []map[string]any
	if err := yaml.Unmarshal([]byte(gatewayapi.RBACRules), &rules); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rules)
	api.Grant(t, ns, string(b))
	e := &env{t: t, api: api, ns: ns}

	class := "tether-test-" + ns
	e.do(http.MethodPost, "/apis/gateway.networking.k8s.io/v1/gatewayclasses", map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
		"metadata": map[string]any{"name": class},
		"spec":     map[string]any{"controllerName": "example.com/some-gateway"},
	})
	t.Cleanup(func() {
		_, _ = api.Do(context.Background(), http.MethodDelete, "/apis/gateway.networking.k8s.io/v1/gatewayclasses/"+class, nil)
	})
	e.do(http.MethodPost, "/apis/gateway.networking.k8s.io/v1/namespaces/"+ns+"/gateways", map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
		"metadata": map[string]any{"name": "gw"},
		"spec": map[string]any{"gatewayClassName": class,
			"listeners": []map[string]any{{"name": "http", "port": 80, "protocol": "HTTP"}}},
	})
	// A Gateway of another class: routes attached only to it are not tether's.
	e.do(http.MethodPost, "/apis/gateway.networking.k8s.io/v1/namespaces/"+ns+"/gateways", map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
		"metadata": map[string]any{"name": "other"},
		"spec": map[string]any{"gatewayClassName": "someone-elses",
			"listeners": []map[string]any{{"name": "http", "port": 80, "protocol": "HTTP"}}},
	})

	e.f = affinitytest.New(t, nil, nil)
	rc, err := kubernetes.RESTConfig(api.UserKubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	src, err := gatewayapi.New(rc, e.f.Registry, gatewayapi.Config{Namespace: ns, GatewayClasses: []string{class}, Defaults: config.DefaultService})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// backend creates Service name (port 80 "http" → 8080) and an EndpointSlice with one ready
// endpoint per host, pods named after the upstreams.
func (e *env) backend(name string, hosts map[string]*kubetest.Host) {
	e.t.Helper()
	e.do(http.MethodPost, "/api/v1/namespaces/"+e.ns+"/services", map[string]any{
		"apiVersion": "v1", "kind": "Service", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"ports": []map[string]any{{"name": "http", "port": 80, "targetPort": 8080}}},
	})
	var eps []map[string]any
	for pod, h := range hosts {
		eps = append(eps, map[string]any{"addresses": []string{h.Addr.String()},
			"conditions": map[string]bool{"ready": true, "serving": true}, "targetRef": map[string]string{"kind": "Pod", "name": pod}})
	}
	e.do(http.MethodPost, "/apis/discovery.k8s.io/v1/namespaces/"+e.ns+"/endpointslices", map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": name + "-1", "labels": map[string]string{"kubernetes.io/service-name": name}},
		"addressType": "IPv4", "ports": []map[string]any{{"name": "http", "port": 8080}}, "endpoints": eps,
	})
}

func route(name string, parents []string, rules ...map[string]any) map[string]any {
	var refs []map[string]any
	for _, p := range parents {
		refs = append(refs, map[string]any{"name": p})
	}
	return map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"parentRefs": refs, "rules": rules},
	}
}

func rule(name, prefix string, persistence map[string]any, backends ...string) map[string]any {
	r := map[string]any{
		"matches": []map[string]any{{"path": map[string]any{"type": "PathPrefix", "value": prefix}}},
	}
	if name != "" {
		r["name"] = name
	}
	if persistence != nil {
		r["sessionPersistence"] = persistence
	}
	var refs []map[string]any
	for _, b := range backends {
		refs = append(refs, map[string]any{"name": b, "port": 80})
	}
	r["backendRefs"] = refs
	return r
}

func (e *env) resourceVersion(route string) string {
	e.t.Helper()
	var r struct {
		Metadata struct{ ResourceVersion string }
	}
	if err := json.Unmarshal(e.do(http.MethodGet, e.routes()+"/"+route, nil), &r); err != nil {
		e.t.Fatal(err)
	}
	return r.Metadata.ResourceVersion
}

type condition struct{ Type, Status, Reason, Message string }

// parentStatus returns the conditions tether wrote for the route, by type (nil when tether
// wrote no entry), and the controllers that have entries.
func (e *env) parentStatus(route string) (map[string]condition, []string) {
	e.t.Helper()
	var r struct {
		Status struct {
			Parents []struct {
				ParentRef      struct{ Name string }
				ControllerName string
				Conditions     []condition
			}
		}
	}
	if err := json.Unmarshal(e.do(http.MethodGet, e.routes()+"/"+route, nil), &r); err != nil {
		e.t.Fatal(err)
	}
	var ctrls []string
	var out map[string]condition
	for _, p := range r.Status.Parents {
		ctrls = append(ctrls, p.ControllerName+" "+p.ParentRef.Name)
		if p.ControllerName == gatewayapi.DefaultControllerName {
			out = map[string]condition{}
			for _, c := range p.Conditions {
				out[c.Type] = c
			}
		}
	}
	return out, ctrls
}

// The Must-show on the real API server with the experimental CRDs: an HTTPRoute rule with
// cookie persistence becomes a cookie service whose sessions stick through the harness to real
// upstreams (test hosts in network namespaces behind an EndpointSlice); a bad value is reported
// in the route's status with its reason and that rule is not served; a missing backend is
// ResolvedRefs=False, BackendNotFound; deleting the route removes the service.
func TestRouteBecomesCookieServiceWithStatus(t *testing.T) {
	e := newEnv(t)
	hostA, hostB := kubetest.NewHost(t), kubetest.NewHost(t)
	upA := discoverytest.HostUpstream(t, hostA, "web-a", 8080)
	upB := discoverytest.HostUpstream(t, hostB, "web-b", 8080)
	e.backend("web", map[string]*kubetest.Host{"web-a": hostA, "web-b": hostB})

	e.do(http.MethodPost, e.routes(), route("shop", []string{"gw"},
		rule("cart", "/cart", map[string]any{"sessionName": "shop-session", "absoluteTimeout": "1h",
			"type": "Cookie", "cookieConfig": map[string]any{"lifetimeType": "Permanent"}}, "web"),
		rule("lost", "/lost", map[string]any{}, "web", "missing"),
		rule("plain", "/plain", nil, "web"),
	))
	e.do(http.MethodPost, e.routes(), route("bad", []string{"gw"},
		rule("long", "/long", map[string]any{"absoluteTimeout": "12h"}, "web")))
	e.do(http.MethodPost, e.routes(), route("theirs", []string{"other"},
		rule("x", "/theirs", map[string]any{}, "web")))

	cart, lost := e.ns+"-shop-cart", e.ns+"-shop-lost"
	testutil.EventuallyWithin(t, 20*time.Second, "the services of shop", func() bool {
		s := e.f.Registry.Snapshot()
		return len(s.Instances(cart)) == 2 && len(s.Instances(lost)) == 2
	})
	svc := discoverytest.Service(t, e.f, cart)
	if svc.Affinity != registry.AffinityCookie || svc.Cookie.Name != "shop-session" || svc.SessionTTL != time.Hour ||
		svc.Cookie.SessionLifetime || svc.Cookie.Path != "/cart" || svc.Match.PathPrefix != "/cart" || svc.IdleTimeout != 30*time.Minute {
		t.Errorf("service %s = %+v; want cookie shop-session, TTL 1h, permanent cookie on /cart, idle 30m", cart, svc)
	}
	var names []string
	for _, s := range e.f.Registry.Snapshot().Services() {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != cart+","+lost {
		t.Errorf("services %v: want only %s and %s (no persistence on plain, 12h refused, theirs not ours)", names, cart, lost)
	}

	// Status: shop accepted with an unresolved backend; bad refused with the reason.
	testutil.EventuallyWithin(t, 20*time.Second, "status of shop and bad", func() bool {
		a, _ := e.parentStatus("shop")
		b, _ := e.parentStatus("bad")
		return a["ResolvedRefs"].Reason != "" && b["Accepted"].Reason != ""
	})
	shop, ctrls := e.parentStatus("shop")
	if c := shop["Accepted"]; c.Status != "True" || c.Reason != "Accepted" {
		t.Errorf("shop Accepted = %+v", c)
	}
	if c := shop["ResolvedRefs"]; c.Status != "False" || c.Reason != "BackendNotFound" || !strings.Contains(c.Message, e.ns+"/missing not found") {
		t.Errorf("shop ResolvedRefs = %+v, want False BackendNotFound naming the missing Service", c)
	}
	if len(ctrls) != 1 || ctrls[0] != gatewayapi.DefaultControllerName+" gw" {
		t.Errorf("shop status parents %v, want tether's one entry for gw", ctrls)
	}
	bad, _ := e.parentStatus("bad")
	if c := bad["Accepted"]; c.Status != "False" || c.Reason != "UnsupportedValue" || !strings.Contains(c.Message, "absoluteTimeout 12h is out of tether's range") {
		t.Errorf("bad Accepted = %+v, want False UnsupportedValue about absoluteTimeout 12h", c)
	}
	if theirs, _ := e.parentStatus("theirs"); theirs != nil {
		t.Errorf("tether wrote status on a route of another class: %+v", theirs)
	}
	// Status writes settle: once a later route's status is written (a full recompute after
	// shop's), shop's object was not written again.
	rv := e.resourceVersion("shop")
	e.do(http.MethodPost, e.routes(), route("later", []string{"gw"}, rule("x", "/later", map[string]any{"absoluteTimeout": "0s"}, "web")))
	testutil.EventuallyWithin(t, 20*time.Second, "status of later", func() bool { c, _ := e.parentStatus("later"); return c["Accepted"].Reason != "" })
	if got := e.resourceVersion("shop"); got != rv {
		t.Errorf("shop was written again (resourceVersion %s → %s) with nothing changed", rv, got)
	}
	e.do(http.MethodDelete, e.routes()+"/later", nil)

	// Traffic: the first response sets the cookie (Max-Age = absoluteTimeout); the session sticks.
	dp := discoverytest.Start(t, e.f)
	dp.WaitEndpoints(t, cart, hostA.Addr.String()+":8080", hostB.Addr.String()+":8080")
	first := dp.Do(t, "GET", "/cart/items")
	ck := first.Cookie("shop-session")
	if first.Status != 200 || ck == nil || ck.MaxAge != 3600 {
		t.Fatalf("first response %d from %q, cookie %+v; want 200 and shop-session with Max-Age 3600", first.Status, first.Instance, ck)
	}
	home, other := upA, upB
	if first.Instance == "web-b" {
		home, other = upB, upA
	}
	before := other.Served()
	for i := range 30 {
		if r := dp.Do(t, "GET", "/cart/items", "Cookie", "shop-session="+ck.Value); r.Status != 200 || r.Instance != home.ID() {
			t.Fatalf("follow-up %d: %d from %q, want 200 from %s", i, r.Status, r.Instance, home.ID())
		}
	}
	if home.Served() < 31 || other.Served() != before {
		t.Errorf("upstream counts: %s served %d (want ≥ 31), %s served %d more (want 0)", home.ID(), home.Served(), other.ID(), other.Served()-before)
	}

	// Deleting the route removes its services and their clusters.
	e.do(http.MethodDelete, e.routes()+"/shop", nil)
	testutil.EventuallyWithin(t, 20*time.Second, "shop's services gone", func() bool {
		_, ok := e.f.Registry.Snapshot().Service(cart)
		_, ok2 := e.f.Registry.Snapshot().Service(lost)
		return !ok && !ok2
	})
	dp.WaitEndpoints(t, cart)
	if r := dp.Do(t, "GET", "/cart/items", "Cookie", "shop-session="+ck.Value); r.Status == 200 {
		t.Errorf("request to the deleted route's path answered 200 from %q", r.Instance)
	}
}

// discovery.gatewayAPI in a config runs the source through the discovery manager (as serve does
// on start and on every reload); a reload without it removes its services.
func TestConfigRunsTheSource(t *testing.T) {
	e := newEnv(t) // its own source runs too; the manager's feeds a registry of its own
	e.do(http.MethodPost, "/api/v1/namespaces/"+e.ns+"/services", map[string]any{
		"apiVersion": "v1", "kind": "Service", "metadata": map[string]any{"name": "web"},
		"spec": map[string]any{"ports": []map[string]any{{"port": 80, "targetPort": 8080}}},
	})
	e.do(http.MethodPost, "/apis/discovery.k8s.io/v1/namespaces/"+e.ns+"/endpointslices", map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": "web-1", "labels": map[string]string{"kubernetes.io/service-name": "web"}},
		"addressType": "IPv4", "ports": []map[string]any{{"port": 8080}},
		"endpoints": []map[string]any{{"addresses": []string{"198.18.3.1"}, "conditions": map[string]bool{"ready": true}}},
	})
	r := route("labelled", nil, rule("", "/", map[string]any{"type": "Header", "sessionName": "X-Cart-Session"}, "web"))
	r["metadata"].(map[string]any)["labels"] = map[string]string{"tether.dev/persist": "yes"}
	e.do(http.MethodPost, e.routes(), r)

	with := func(extra string) *config.Config {
		c, err := config.Parse([]byte(`apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
discovery:
  kubernetes: {kubeconfig: `+e.api.UserKubeconfig+`}
`+extra), "tether.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	reg := registry.New()
	m := discovery.New(reg)
	defer m.Stop()
	m.Apply(context.Background(), with(`  gatewayAPI: {enabled: true, namespace: `+e.ns+`, routeSelector: tether.dev/persist=yes}
`))
	name := e.ns + "-labelled-r0"
	testutil.EventuallyWithin(t, 20*time.Second, "the labelled route's service", func() bool { return len(reg.Snapshot().Instances(name)) == 1 })
	s, _ := reg.Snapshot().Service(name)
	if s.Affinity != registry.AffinityHeader || s.HeaderField != "x-cart-session" {
		t.Errorf("service %+v: want header affinity on x-cart-session", s)
	}
	if in := reg.Snapshot().Instances(name)[0]; in.Address != "198.18.3.1" || in.HTTPPort != 8080 {
		t.Errorf("instance %+v: want 198.18.3.1:8080 (the Service's unnamed port)", in)
	}
	var st registry.SourceStatus
	for _, src := range reg.Sources() {
		if src.Name == gatewayapi.SourceName {
			st = src
		}
	}
	if !st.Synced || st.Failing || st.Services != 1 || st.Instances != 1 || st.Kind != gatewayapi.Kind {
		t.Errorf("source status %+v: want synced, 1 service, 1 instance", st)
	}
	m.Apply(context.Background(), with(""))
	if _, ok := reg.Snapshot().Service(name); ok {
		t.Error("the service stayed after the config dropped discovery.gatewayAPI")
	}
}
