package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/tether-dev/tether/internal/kubetest"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/discovery/discoverytest"
	"github.com/tether-dev/tether/pkg/discovery/kubernetes"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// env is one test's namespace on the shared API server, a tether engine whose registry is fed
// by a kubernetes source running as the unprivileged user "tether" with exactly RBACRules.
type env struct {
	t   *testing.T
	api *kubetest.Server
	ns  string
	f   *affinitytest.Fixture
	src string
}

func newEnv(t *testing.T, target kubernetes.Target) *env {
	t.Helper()
	api := kubetest.Shared(t)
	ns := api.Namespace(t, "disc")
	var rules []map[string]any
	if err := yaml.Unmarshal([]byte(kubernetes.RBACRules), &rules); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rules)
	api.Grant(t, ns, string(b))

	web := affinitytest.Service("web", registry.AffinityCookie)
	f := affinitytest.New(t, []registry.Service{web}, nil)
	cfg, err := kubernetes.RESTConfig(api.UserKubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	target.Service, target.Namespace = "web", ns
	src, err := kubernetes.New(cfg, f.Registry, target)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &env{t: t, api: api, ns: ns, f: f, src: src.Name()}
}

func (e *env) do(method, path string, obj any) {
	e.t.Helper()
	var body []byte
	if obj != nil {
		var err error
		if body, err = json.Marshal(obj); err != nil {
			e.t.Fatal(err)
		}
	}
	if _, err := e.api.Do(context.Background(), method, path, body); err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
}

type ep struct {
	pod, addr, zone             string
	ready, serving, terminating bool
}

func slice(name, service string, eps ...ep) map[string]any {
	var list []map[string]any
	for _, e := range eps {
		m := map[string]any{
			"addresses":  []string{e.addr},
			"conditions": map[string]bool{"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
			"targetRef":  map[string]string{"kind": "Pod", "name": e.pod},
		}
		if e.zone != "" {
			m["zone"] = e.zone
		}
		list = append(list, m)
	}
	return map[string]any{
		"apiVersion":  "discovery.k8s.io/v1",
		"kind":        "EndpointSlice",
		"metadata":    map[string]any{"name": name, "labels": map[string]string{"kubernetes.io/service-name": service}},
		"addressType": "IPv4",
		"ports":       []map[string]any{{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9090}},
		"endpoints":   list,
	}
}

func (e *env) slices() string {
	return "/apis/discovery.k8s.io/v1/namespaces/" + e.ns + "/endpointslices"
}

// wait polls the registry (fed by the informer's events) until cond holds, then waits until the
// engine routes by that generation: the registry having a change is not the engine having seen
// it (Run applies generations asynchronously), and the callers decide next.
func (e *env) wait(what string, cond func(*registry.Snapshot) bool) {
	e.t.Helper()
	if !testutil.Poll(20*time.Second, func() bool { return cond(e.f.Registry.Snapshot()) }) {
		e.t.Fatalf("timed out waiting for %s; instances %+v; sources %+v", what, e.f.Registry.Snapshot().Instances("web"), e.f.Registry.Sources())
	}
	e.f.Sync(e.t)
}

func ids(snap *registry.Snapshot, keep func(registry.Instance) bool) []string {
	var out []string
	for _, in := range snap.Instances("web") {
		if keep(in) {
			out = append(out, in.ID)
		}
	}
	return out
}

// newSession decides one new cookie session and returns its cookie and instance.
func (e *env) newSession() (cookie, instance string) {
	e.t.Helper()
	d, err := e.f.Engine.Decide(context.Background(), affinitytest.HTTP("web", "GET", "/"))
	if err != nil {
		e.t.Fatalf("new session: %v", err)
	}
	hv := d.OnResponse(affinity.Response{Status: 200})
	d.End()
	return affinitytest.SetCookie(hv, "tether-session"), d.Instance().ID
}

func (e *env) follow(cookie string) string {
	e.t.Helper()
	d, err := e.f.Engine.Decide(context.Background(), affinitytest.HTTP("web", "GET", "/", "cookie", "tether-session="+cookie))
	if err != nil {
		e.t.Fatalf("session %s: %v", cookie, err)
	}
	d.OnResponse(affinity.Response{Status: 200})
	d.End()
	return d.Instance().ID
}

// localities returns tether's EDS for web as zone → endpoint addresses (with health status).
func localities(snap *registry.Snapshot) map[string][]string {
	cla := xds.ClusterLoadAssignment("web", snap.Instances("web"))
	out := map[string][]string{}
	for _, l := range cla.GetEndpoints() {
		for _, lb := range l.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			out[l.GetLocality().GetZone()] = append(out[l.GetLocality().GetZone()],
				fmt.Sprintf("%s:%d %s", sa.GetAddress(), sa.GetPortValue(), lb.GetHealthStatus()))
		}
	}
	return out
}

// The Must-show cases of the issue, in one story on the real API server: a new ready endpoint
// takes new sessions; a terminating one drains (its session stays, no new one lands there); a
// deleted one is gone; a zone change shows in EDS localities. The addresses are in
// 198.18.0.0/15 (reserved for testing) and receive no traffic here: this test asserts tether's
// decisions and EDS; TestEndpointSlicesTrafficToNetnsHosts sends requests to real hosts.
func TestEndpointSlicesDriveDecisionsAndEDS(t *testing.T) {
	e := newEnv(t, kubernetes.Target{ServiceName: "web", HTTPPort: "http"})
	a := ep{pod: "web-a", addr: "198.18.0.10", zone: "zone-1", ready: true, serving: true}
	e.do(http.MethodPost, e.slices(), slice("web-1", "web", a))
	e.wait("web-a", func(s *registry.Snapshot) bool { return len(s.Instances("web")) == 1 })
	got, _ := e.f.Registry.Snapshot().Instance(registry.Key{Service: "web", ID: "web-a"})
	want := registry.Instance{Service: "web", ID: "web-a", Address: "198.18.0.10", HTTPPort: 8080, Weight: 1, Zone: "zone-1",
		State: registry.StateActive, Health: registry.HealthHealthy}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("instance from the slice (-want +got):\n%s", diff)
	}
	cookieA, inst := e.newSession()
	if inst != "web-a" {
		t.Fatalf("first session on %s, want web-a", inst)
	}

	// A second slice of the same Service adds a ready endpoint; the first is made terminating.
	b := ep{pod: "web-b", addr: "198.18.0.11", zone: "zone-1", ready: true, serving: true}
	e.do(http.MethodPost, e.slices(), slice("web-2", "web", b))
	a.ready, a.terminating = false, true // serving, terminating: Kubernetes' graceful shutdown
	e.do(http.MethodPut, e.slices()+"/web-1", withVersion(e, "web-1", slice("web-1", "web", a)))
	e.wait("web-a draining, web-b active", func(s *registry.Snapshot) bool {
		return slices.Equal(ids(s, func(in registry.Instance) bool { return in.State == registry.StateDraining }), []string{"web-a"}) &&
			slices.Equal(ids(s, registry.Instance.Placeable), []string{"web-b"})
	})
	for range 10 {
		if _, inst := e.newSession(); inst != "web-b" {
			t.Fatalf("new session on %s while web-a drains, want web-b", inst)
		}
	}
	if inst := e.follow(cookieA); inst != "web-a" {
		t.Fatalf("draining web-a's session went to %s, want it kept on web-a", inst)
	}
	if diff := cmp.Diff(map[string][]string{"zone-1": {"198.18.0.10:8080 DRAINING", "198.18.0.11:8080 HEALTHY"}}, localities(e.f.Registry.Snapshot())); diff != "" {
		t.Errorf("EDS while web-a drains (-want +got):\n%s", diff)
	}

	// web-a's slice is deleted: it is gone, its session moves.
	e.do(http.MethodDelete, e.slices()+"/web-1", nil)
	e.wait("web-a gone", func(s *registry.Snapshot) bool {
		return slices.Equal(ids(s, func(registry.Instance) bool { return true }), []string{"web-b"})
	})
	if inst := e.follow(cookieA); inst == "web-a" {
		t.Fatal("a session still routes to the deleted web-a")
	}

	// web-b moves zone (and a serving-but-not-ready endpoint appears): EDS localities follow.
	b.zone = "zone-2"
	c := ep{pod: "web-c", addr: "198.18.0.12", zone: "zone-1", ready: false, serving: true}
	e.do(http.MethodPut, e.slices()+"/web-2", withVersion(e, "web-2", slice("web-2", "web", b, c)))
	e.wait("web-b in zone-2", func(s *registry.Snapshot) bool {
		in, ok := s.Instance(registry.Key{Service: "web", ID: "web-b"})
		return ok && in.Zone == "zone-2" && len(s.Instances("web")) == 2
	})
	if diff := cmp.Diff(map[string][]string{"zone-2": {"198.18.0.11:8080 HEALTHY"}}, localities(e.f.Registry.Snapshot())); diff != "" {
		t.Errorf("EDS after the zone change (-want +got; web-c is not ready, so not carried):\n%s", diff)
	}
	if got, _ := e.f.Registry.Snapshot().Instance(registry.Key{Service: "web", ID: "web-c"}); got.Health != registry.HealthUnhealthy {
		t.Errorf("serving but not ready web-c: health %s, want unhealthy", got.Health)
	}
	for range 5 {
		if _, inst := e.newSession(); inst != "web-b" {
			t.Fatalf("new session on %s, want web-b (web-c is not ready)", inst)
		}
	}
	st := sourceStatus(t, e.f.Registry, e.src, true)
	if !st.Synced || st.Failing || st.Instances != 2 || st.Kind != "kubernetes" {
		t.Errorf("source status = %+v, want synced, not failing, 2 instances", st)
	}
}

// Weight and standby come from the endpoint's Pod annotations (or the slice's); a selector
// picks slices by label; an unnamed single port serves HTTP.
func TestAnnotationsAndSelector(t *testing.T) {
	e := newEnv(t, kubernetes.Target{Selector: "app=web", HTTPPort: "http"})
	// No kubelet runs, so Pods stay Pending; the API server still needs their service account.
	e.do(http.MethodPost, "/api/v1/namespaces/"+e.ns+"/serviceaccounts", map[string]any{"metadata": map[string]string{"name": "default"}})
	for _, p := range []struct{ name, weight, standby string }{{"web-a", "7", ""}, {"web-b", "", "true"}} {
		ann := map[string]string{}
		if p.weight != "" {
			ann[kubernetes.AnnotationWeight] = p.weight
		}
		if p.standby != "" {
			ann[kubernetes.AnnotationStandby] = p.standby
		}
		e.do(http.MethodPost, "/api/v1/namespaces/"+e.ns+"/pods", map[string]any{
			"metadata": map[string]any{"name": p.name, "annotations": ann},
			"spec":     map[string]any{"containers": []map[string]string{{"name": "app", "image": "example.invalid/app"}}},
		})
	}
	s := slice("web-x", "other-name", ep{pod: "web-a", addr: "198.18.1.1", ready: true, serving: true},
		ep{pod: "web-b", addr: "198.18.1.2", ready: true, serving: true}, ep{pod: "web-c", addr: "198.18.1.3", ready: true, serving: true})
	s["metadata"].(map[string]any)["labels"].(map[string]string)["app"] = "web"
	s["metadata"].(map[string]any)["annotations"] = map[string]string{kubernetes.AnnotationWeight: "3"}
	s["ports"] = []map[string]any{{"name": "", "port": 8080}}
	e.do(http.MethodPost, e.slices(), s)
	// A slice without the label is not followed.
	e.do(http.MethodPost, e.slices(), slice("web-y", "web", ep{pod: "web-z", addr: "198.18.1.9", ready: true, serving: true}))
	e.wait("three instances", func(s *registry.Snapshot) bool { return len(s.Instances("web")) == 3 })
	got := map[string]string{}
	for _, in := range e.f.Registry.Snapshot().Instances("web") {
		got[in.ID] = fmt.Sprintf("%s:%d weight %d %s", in.Address, in.HTTPPort, in.Weight, in.State)
	}
	want := map[string]string{
		"web-a": "198.18.1.1:8080 weight 7 active",  // the Pod's weight wins over the slice's
		"web-b": "198.18.1.2:8080 weight 3 standby", // the slice's weight, the Pod's standby
		"web-c": "198.18.1.3:8080 weight 3 active",  // no Pod: the slice's annotations
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
	// A Pod annotation change is followed.
	e.do(http.MethodPatch, "/api/v1/namespaces/"+e.ns+"/pods/web-b", map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{kubernetes.AnnotationStandby: nil}}})
	e.wait("web-b active", func(s *registry.Snapshot) bool {
		in, _ := s.Instance(registry.Key{Service: "web", ID: "web-b"})
		return in.State == registry.StateActive
	})
}

// Without the RBAC rules the source cannot sync and says why; once granted, it syncs. Later
// failures keep the last good set.
func TestForbiddenThenGranted(t *testing.T) {
	api := kubetest.Shared(t)
	ns := api.Namespace(t, "disc")
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, nil)
	cfg, err := kubernetes.RESTConfig(api.UserKubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	src, err := kubernetes.New(cfg, f.Registry, kubernetes.Target{Service: "web", Namespace: ns, ServiceName: "web", HTTPPort: "http"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if st := sourceStatus(t, f.Registry, src.Name(), false); st.Failing && !st.Synced && st.LastError != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("forbidden not reported: %+v", f.Registry.Sources())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var rules []map[string]any
	if err := yaml.Unmarshal([]byte(kubernetes.RBACRules), &rules); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rules)
	api.Grant(t, ns, string(b))
	body, _ := json.Marshal(slice("web-1", "web", ep{pod: "web-a", addr: "198.18.2.1", ready: true, serving: true}))
	if _, err := api.Do(context.Background(), http.MethodPost, "/apis/discovery.k8s.io/v1/namespaces/"+ns+"/endpointslices", body); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second) // the reflector retries with back-off
	for len(f.Registry.Snapshot().Instances("web")) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("source did not sync after the grant: %+v", f.Registry.Sources())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := sourceStatus(t, f.Registry, src.Name(), true); !st.Synced || st.Failing {
		t.Errorf("status after the grant = %+v, want synced, not failing", st)
	}
}

// sourceStatus returns the named source's status; must says whether its absence fails the test.
func sourceStatus(t *testing.T, r *registry.Registry, name string, must bool) registry.SourceStatus {
	t.Helper()
	for _, s := range r.Sources() {
		if s.Name == name {
			return s
		}
	}
	if must {
		t.Fatalf("no source %s", name)
	}
	return registry.SourceStatus{}
}

// withVersion sets the current resourceVersion of slice name on obj (a PUT needs it).
func withVersion(e *env, name string, obj map[string]any) map[string]any {
	e.t.Helper()
	b, err := e.api.Do(context.Background(), http.MethodGet, e.slices()+"/"+name, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	var cur struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &cur); err != nil {
		e.t.Fatal(err)
	}
	obj["metadata"].(map[string]any)["resourceVersion"] = cur.Metadata.ResourceVersion
	return obj
}

// The same story with traffic: the endpoints are test hosts in network namespaces this test
// makes (the API server refuses loopback endpoints), each running a real HTTP upstream, and
// requests go through the Envoy-faithful harness following tether's xDS. Counts are taken at the
// upstreams: a new ready endpoint takes the new sessions, a terminating one keeps only its
// session's requests, a deleted one gets nothing more.
func TestEndpointSlicesTrafficToNetnsHosts(t *testing.T) {
	e := newEnv(t, kubernetes.Target{ServiceName: "web", HTTPPort: "http"})
	hostA, hostB := kubetest.NewHost(t), kubetest.NewHost(t)
	upA := discoverytest.HostUpstream(t, hostA, "web-a", 8080)
	upB := discoverytest.HostUpstream(t, hostB, "web-b", 8080)
	a := ep{pod: "web-a", addr: hostA.Addr.String(), ready: true, serving: true}
	b := ep{pod: "web-b", addr: hostB.Addr.String(), ready: true, serving: true}
	addrA, addrB := a.addr+":8080", b.addr+":8080"

	e.do(http.MethodPost, e.slices(), slice("web-1", "web", a))
	e.wait("web-a", func(s *registry.Snapshot) bool { return len(s.Instances("web")) == 1 })
	dp := discoverytest.Start(t, e.f)
	dp.WaitEndpoints(t, "web", addrA)
	first := dp.Do(t, "GET", "/")
	ck := first.Cookie("tether-session")
	if first.Status != 200 || first.Instance != "web-a" || ck == nil {
		t.Fatalf("first session: %d from %q, cookie %v; want 200 from web-a with a session cookie", first.Status, first.Instance, ck)
	}

	// web-b becomes ready beside web-a, then web-a starts terminating.
	e.do(http.MethodPost, e.slices(), slice("web-2", "web", b))
	dp.WaitEndpoints(t, "web", addrA, addrB)
	a.ready, a.terminating = false, true
	e.do(http.MethodPut, e.slices()+"/web-1", withVersion(e, "web-1", slice("web-1", "web", a)))
	e.wait("web-a draining", func(s *registry.Snapshot) bool {
		in, _ := s.Instance(registry.Key{Service: "web", ID: "web-a"})
		return in.State == registry.StateDraining
	})
	servedA, servedB := upA.Served(), upB.Served()
	const news, follows = 10, 10
	for i := range news {
		if r := dp.Do(t, "GET", "/"); r.Status != 200 || r.Instance != "web-b" || r.Cookie("tether-session") == nil {
			t.Fatalf("new session %d while web-a terminates: %d from %q, want 200 from web-b", i, r.Status, r.Instance)
		}
	}
	for i := range follows {
		if r := dp.Do(t, "GET", "/", "Cookie", "tether-session="+ck.Value); r.Status != 200 || r.Instance != "web-a" {
			t.Fatalf("follow-up %d of web-a's session: %d from %q, want it kept on web-a", i, r.Status, r.Instance)
		}
	}
	if dA, dB := upA.Served()-servedA, upB.Served()-servedB; dA != follows || dB != news {
		t.Errorf("at the upstreams: web-a served %d, web-b %d; want %d (the session's follow-ups) and %d (the new sessions)", dA, dB, follows, news)
	}

	// web-a's slice is deleted: its session moves to web-b, web-a gets nothing more.
	e.do(http.MethodDelete, e.slices()+"/web-1", nil)
	dp.WaitEndpoints(t, "web", addrB)
	servedA = upA.Served()
	if r := dp.Do(t, "GET", "/", "Cookie", "tether-session="+ck.Value); r.Status != 200 || r.Instance != "web-b" {
		t.Errorf("web-a's session after web-a was deleted: %d from %q, want 200 from web-b", r.Status, r.Instance)
	}
	if upA.Served() != servedA {
		t.Errorf("the deleted web-a still received %d requests", upA.Served()-servedA)
	}
}
