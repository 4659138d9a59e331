package gatewayapi_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/discovery/gatewayapi"
	"github.com/tether-dev/tether/pkg/registry"
)

// world builds a World in namespace "shop" with Gateway gw of class "ours", Services web
// (port 80 "http", pods web-1, web-2) and api (port 80 "http", pod api-1), and the routes given
// as YAML documents (HTTPRoute objects without apiVersion and kind).
func world(t *testing.T, routes ...string) gatewayapi.World {
	t.Helper()
	w := gatewayapi.World{
		GatewayClass: map[string]string{"shop/gw": "ours", "shop/theirs": "other"},
		Services:     map[string]*corev1.Service{},
		Slices:       map[string][]*discoveryv1.EndpointSlice{},
	}
	ready := true
	port, name := int32(8080), "http"
	for svc, pods := range map[string][]string{"web": {"web-1", "web-2"}, "api": {"api-1"}} {
		w.Services["shop/"+svc] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: svc},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: svc + "-1"},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}}}
		for i, p := range pods {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"198.18.4." + string(rune('1'+i))},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: p}})
		}
		w.Slices["shop/"+svc] = []*discoveryv1.EndpointSlice{sl}
	}
	for _, r := range routes {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(r), &m); err != nil {
			t.Fatal(err)
		}
		meta, _ := m["metadata"].(map[string]any)
		meta["namespace"], meta["generation"] = "shop", 3
		js, _ := json.Marshal(m)
		var typed gwv1.HTTPRoute
		if err := json.Unmarshal(js, &typed); err != nil {
			t.Fatal(err)
		}
		w.Routes = append(w.Routes, gatewayapi.Route{Typed: &typed, JSON: js})
	}
	return w
}

var cfg = gatewayapi.Config{ControllerName: gatewayapi.DefaultControllerName, GatewayClasses: []string{"ours"},
	RouteSelector: "tether.dev/persist", Defaults: config.DefaultService}

// route YAML: name r, parentRef gw, one rule with the given sessionPersistence and extra rule
// fields, backend web.
func oneRule(persistence string, extra ...string) string {
	return `metadata: {name: r, namespace: shop, generation: 3}
spec:
  parentRefs: [{name: gw}]
  rules:
  - sessionPersistence: ` + persistence + `
    backendRefs: [{name: web, port: 80}]
` + strings.Join(extra, "\n")
}

func conds(st []gwv1.RouteParentStatus) map[string]string {
	out := map[string]string{}
	for _, p := range st {
		for _, c := range p.Conditions {
			out[c.Type] = string(c.Status) + " " + c.Reason + ": " + c.Message
		}
	}
	return out
}

func TestTranslatePersistence(t *testing.T) {
	def := func(mode registry.AffinityMode, f func(*registry.Service)) registry.Service {
		s := config.DefaultService("shop-r-r0", mode)
		s.Match.PathPrefix = "/"
		s.Cookie.SessionLifetime = mode == registry.AffinityCookie
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name        string
		persistence string
		annotations string
		want        registry.Service
	}{
		{"empty: cookie, session lifetime, defaults", `{}`, "", def(registry.AffinityCookie, func(*registry.Service) {})},
		{"v1.6 names: sessionName, absoluteTimeout, Permanent", `{sessionName: cart, absoluteTimeout: 2h, cookieConfig: {lifetimeType: Permanent}}`, "",
			def(registry.AffinityCookie, func(s *registry.Service) {
				s.Cookie.Name, s.SessionTTL, s.Cookie.SessionLifetime = "cart", 2*time.Hour, false
			})},
		{"union: cookie{name, path, lifetimeType}", `{absoluteTimeout: 10m, cookie: {name: c2, path: /app, lifetimeType: Permanent}}`, "",
			def(registry.AffinityCookie, func(s *registry.Service) {
				s.Cookie.Name, s.Cookie.Path, s.SessionTTL, s.IdleTimeout, s.Cookie.SessionLifetime = "c2", "/app", 10*time.Minute, 10*time.Minute, false
			})},
		{"union: header{name}", `{type: Header, header: {name: X-Session-Id}}`, "",
			def(registry.AffinityHeader, func(s *registry.Service) { s.HeaderField = "x-session-id" })},
		{"v1.x Header with sessionName", `{type: Header, sessionName: X-Session-Id}`, "",
			def(registry.AffinityHeader, func(s *registry.Service) { s.HeaderField = "x-session-id" })},
		{"idleTimeout before v1.6", `{absoluteTimeout: 1h, idleTimeout: 5m}`, "",
			def(registry.AffinityCookie, func(s *registry.Service) { s.SessionTTL, s.IdleTimeout = time.Hour, 5*time.Minute })},
		{"the idle annotation wins", `{absoluteTimeout: 1h, idleTimeout: 5m}`, `{tether.dev/idle-timeout: 90s}`,
			def(registry.AffinityCookie, func(s *registry.Service) { s.SessionTTL, s.IdleTimeout = time.Hour, 90*time.Second })},
		{"the idle annotation 0 turns it off", `{}`, `{tether.dev/idle-timeout: "0"}`,
			def(registry.AffinityCookie, func(s *registry.Service) { s.IdleTimeout = 0 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := oneRule(tc.persistence)
			if tc.annotations != "" {
				r = strings.Replace(r, "generation: 3}", "generation: 3, annotations: "+tc.annotations+"}", 1)
			}
			res := gatewayapi.Translate(cfg, world(t, r))
			if len(res.Services) != 1 {
				t.Fatalf("services %+v, status %v", res.Services, conds(res.Status["shop/r"]))
			}
			if diff := cmp.Diff(tc.want, res.Services[0]); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
			if c := conds(res.Status["shop/r"]); !strings.HasPrefix(c["Accepted"], "True Accepted") || !strings.HasPrefix(c["ResolvedRefs"], "True ResolvedRefs") {
				t.Errorf("conditions %v", c)
			}
		})
	}
}

// What tether cannot honour is refused with UnsupportedValue and a message naming the rule and
// the reason; such rules make no service.
func TestTranslateRefusals(t *testing.T) {
	for _, tc := range []struct{ name, route, want string }{
		{"absoluteTimeout over 6h", oneRule(`{absoluteTimeout: 7h}`), "rule 0: sessionPersistence.absoluteTimeout 7h is out of tether's range 1s..6h0m0s"},
		{"absoluteTimeout 0", oneRule(`{absoluteTimeout: 0s}`), "absoluteTimeout 0s is out of tether's range"},
		{"malformed duration (older CRDs)", oneRule(`{absoluteTimeout: 1.5h}`), `"1.5h" is not a Gateway API duration`},
		{"unknown type", oneRule(`{type: Query}`), `sessionPersistence.type "Query" is not supported`},
		{"idle over absolute", oneRule(`{absoluteTimeout: 1m, idleTimeout: 5m}`), "idle timeout 5m0s is longer than the session's absolute timeout 1m0s"},
		{"bad idle annotation", strings.Replace(oneRule(`{}`), "generation: 3}", "generation: 3, annotations: {tether.dev/idle-timeout: soon}}", 1), `annotation tether.dev/idle-timeout: "soon"`},
		{"Permanent without absoluteTimeout", oneRule(`{cookieConfig: {lifetimeType: Permanent}}`), "a Permanent cookie needs absoluteTimeout"},
		{"header name too short", oneRule(`{type: Header, sessionName: X-S}`), `session header "X-S" must be 5..40 characters`},
		{"cookie union with type Header", oneRule(`{type: Header, cookie: {name: c}}`), "sessionPersistence.cookie is set with type Header"},
		{"two matches", oneRule(`{}`, `    matches: [{path: {value: /a}}, {path: {value: /b}}]`), "2 matches: tether identifies a rule's requests by hostnames and one path prefix"},
		{"exact path", oneRule(`{}`, `    matches: [{path: {type: Exact, value: /a}}]`), "path match type Exact: tether matches path prefixes only"},
		{"header match", oneRule(`{}`, `    matches: [{headers: [{name: x, value: "v1"}]}]`), "header, query or method matches"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := gatewayapi.Translate(cfg, world(t, tc.route))
			if len(res.Services) != 0 {
				t.Errorf("services %+v, want none", res.Services)
			}
			c := conds(res.Status["shop/r"])["Accepted"]
			if !strings.HasPrefix(c, "False UnsupportedValue: ") || !strings.Contains(c, tc.want) {
				t.Errorf("Accepted = %q, want False UnsupportedValue containing %q", c, tc.want)
			}
		})
	}
}

func TestTranslateRoutesAndBackends(t *testing.T) {
	res := gatewayapi.Translate(cfg, world(t,
		`metadata: {name: mixed}
spec:
  parentRefs: [{name: gw}, {name: theirs}]
  hostnames: [shop.example, "*.shop.example"]
  rules:
  - name: Good
    matches: [{path: {type: PathPrefix, value: /good}}]
    sessionPersistence: {}
    backendRefs: [{name: web, port: 80, weight: 3}, {name: api, port: 80, weight: 1}, {name: web, port: 81}, {name: gone, port: 80},
      {group: example.com, kind: Bucket, name: b}, {name: api, namespace: other, port: 80}, {name: api, port: 80, weight: 0}]
  - name: bad
    sessionPersistence: {absoluteTimeout: 9h}
    backendRefs: [{name: web, port: 80}]
  - name: plain
    backendRefs: [{name: web, port: 80}]`,
		`metadata: {name: labelled, labels: {tether.dev/persist: "yes"}}
spec:
  parentRefs: [{name: theirs}]
  rules: [{sessionPersistence: {}, backendRefs: [{name: api, port: 80}]}]`,
		`metadata: {name: not-ours}
spec:
  parentRefs: [{name: theirs}]
  rules: [{sessionPersistence: {}, backendRefs: [{name: api, port: 80}]}]`,
		`metadata: {name: no-persistence}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: api, port: 80}]}]`,
		`metadata: {name: a-very-long-route-name-that-does-not-fit-into-a-dns-label-at-all}
spec:
  parentRefs: [{name: gw}]
  rules: [{sessionPersistence: {}, backendRefs: [{name: api, port: 80}]}]`,
	))
	var names []string
	for _, s := range res.Services {
		names = append(names, s.Name)
	}
	// A name past 63 characters is cut to 54 and suffixed with 8 hex digits of its SHA-256.
	wantNames := []string{"shop-a-very-long-route-name-that-does-not-fit-into-a-d-af981a70", "shop-labelled-r0", "shop-mixed-good"}
	if diff := cmp.Diff(wantNames, names); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	good := res.Services[2]
	if diff := cmp.Diff(registry.Match{Authorities: []string{"shop.example", "*.shop.example"}, PathPrefix: "/good"}, good.Match); diff != "" {
		t.Errorf("match (-want +got):\n%s", diff)
	}
	// web (weight 3, two pods) and api (weight 1, one pod): 1.5 vs 1 per endpoint.
	weights := map[string]uint32{}
	for _, in := range res.Instances {
		if in.Service == "shop-mixed-good" {
			weights[in.ID] = in.Weight
		}
	}
	if diff := cmp.Diff(map[string]uint32{"web-1": 1000, "web-2": 1000, "api-1": 667}, weights); diff != "" {
		t.Errorf("weights (-want +got):\n%s", diff)
	}

	mixed := res.Status["shop/mixed"]
	if len(mixed) != 1 || mixed[0].ParentRef.Name != "gw" || mixed[0].ControllerName != gatewayapi.DefaultControllerName {
		t.Fatalf("mixed status %+v: want one entry, for gw (theirs is another class)", mixed)
	}
	c := conds(mixed)
	want := map[string]string{
		"Accepted":         "True Accepted: tether serves session persistence of rule 0 (Good); not of the rest",
		"PartiallyInvalid": "True UnsupportedValue: rule 1 (bad): sessionPersistence.absoluteTimeout 9h is out of tether's range 1s..6h0m0s",
		"ResolvedRefs": "False BackendNotFound: rule 0 (Good): Service shop/web has no port 81; rule 0 (Good): Service shop/gone not found; " +
			`rule 0 (Good): backendRef b is not a core Service (group "example.com", kind "Bucket"); ` +
			"rule 0 (Good): backendRef other/api is in another namespace (tether does not read ReferenceGrants)",
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if mixed[0].Conditions[0].ObservedGeneration != 3 {
		t.Errorf("observedGeneration %d, want the route's 3", mixed[0].Conditions[0].ObservedGeneration)
	}
	if st := res.Status["shop/labelled"]; len(st) != 1 || st[0].ParentRef.Name != "theirs" {
		t.Errorf("labelled status %+v: want an entry for its parent theirs (selected by label)", st)
	}
	for _, r := range []string{"shop/not-ours", "shop/no-persistence"} {
		if st, ok := res.Status[r]; !ok || st != nil {
			t.Errorf("status of %s = %+v, %v: want nil (tether's entries removed)", r, st, ok)
		}
	}
}
