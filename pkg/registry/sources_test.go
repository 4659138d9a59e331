package registry_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tether-dev/tether/pkg/registry"
)

// Regression: instances registered through the admin API used to vanish on the next config
// reload (Apply kept configured instances only).
func TestRegisteredInstancesSurviveReload(t *testing.T) {
	r := registry.New()
	web := []registry.Service{svc("web")}
	if err := r.Apply(web, []registry.Instance{inst("web", "a", 8081)}); err != nil {
		t.Fatal(err)
	}
	b := inst("web", "b", 8082)
	if err := r.Register(b); err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(b.Key(), registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	a := inst("web", "a", 8081)
	a.Weight = 3
	if err := r.Apply(web, []registry.Instance{a}); err != nil {
		t.Fatal(err)
	}
	got := mustInstance(t, r, b.Key())
	if got.State != registry.StateDraining || got.HTTPPort != 8082 {
		t.Fatalf("registered instance after reload = %+v, want it kept, draining", got)
	}
	// Its service leaves the config: the instance is not published (orphaned) but kept, and
	// comes back with the service.
	if err := r.Apply(nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Snapshot().Instance(b.Key()); ok {
		t.Fatal("instance of a removed service still published")
	}
	if st := status(t, r, registry.LayerAPI); st.Orphaned != 1 || st.Instances != 1 {
		t.Errorf("api layer status = %+v, want 1 instance, 1 orphaned", st)
	}
	if err := r.Apply(web, nil); err != nil {
		t.Fatal(err)
	}
	if got := mustInstance(t, r, b.Key()); got.State != registry.StateActive {
		t.Errorf("instance back with its service: state %s, want active (runtime state is forgotten with the instance)", got.State)
	}
	// Deregistering it removes it for good.
	if err := r.Deregister(b.Key()); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(web, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Snapshot().Instance(b.Key()); ok {
		t.Fatal("deregistered instance came back on reload")
	}
}

func TestPrecedence(t *testing.T) {
	r := registry.New()
	cfgA := inst("web", "a", 8081)
	if err := r.Apply([]registry.Service{svc("web")}, []registry.Instance{cfgA}); err != nil {
		t.Fatal(err)
	}
	apiB := inst("web", "b", 8082)
	if err := r.Register(apiB); err != nil {
		t.Fatal(err)
	}
	// Source "k8s" declares a, b (shadowed by config and api), c, and a service "web" (shadowed
	// by config) and "gw" of its own. Source "dns" declares c too: "dns" sorts first and wins.
	srcA, srcB, srcC := inst("web", "a", 9001), inst("web", "b", 9002), inst("web", "c", 9003)
	gwSvc := svc("gw")
	gwSvc.Affinity = registry.AffinityHeader
	k8sWeb := svc("web")
	k8sWeb.SessionsPerInstance = 99
	if err := r.UpdateSource("k8s", "kubernetes", []registry.Service{k8sWeb, gwSvc}, []registry.Instance{srcA, srcB, srcC, inst("gw", "g", 7000)}); err != nil {
		t.Fatal(err)
	}
	dnsC := inst("web", "c", 5353)
	if err := r.UpdateSource("dns", "dns", nil, []registry.Instance{dnsC, inst("nosuch", "x", 1)}); err != nil {
		t.Fatal(err)
	}
	snap := r.Snapshot()
	ports := map[string]int{}
	for _, in := range snap.Instances("web") {
		ports[in.ID] = in.HTTPPort
	}
	if diff := cmp.Diff(map[string]int{"a": 8081, "b": 8082, "c": 5353}, ports); diff != "" {
		t.Errorf("web instances' ports (-want +got):\n%s", diff)
	}
	if s, _ := snap.Service("web"); s.SessionsPerInstance != 20 {
		t.Errorf("web service from the source overrode the config's: %+v", s)
	}
	if s, ok := snap.Service("gw"); !ok || s.Affinity != registry.AffinityHeader || len(snap.Instances("gw")) != 1 {
		t.Errorf("source service gw = %+v (present %v), instances %v", s, ok, snap.Instances("gw"))
	}
	want := []registry.SourceStatus{
		{Name: "config", Kind: "file", Synced: true, Services: 1, Instances: 1},
		{Name: "api", Kind: "api", Synced: true, Instances: 1},
		{Name: "dns", Kind: "dns", Synced: true, Instances: 2, Orphaned: 1},
		{Name: "k8s", Kind: "kubernetes", Synced: true, Services: 2, Instances: 4, Shadowed: 3},
	}
	if diff := cmp.Diff(want, r.Sources(), cmpopts.IgnoreFields(registry.SourceStatus{}, "LastSync")); diff != "" {
		t.Errorf("Sources (-want +got):\n%s", diff)
	}
	// The config drops a: the source's a shows through.
	if err := r.Apply([]registry.Service{svc("web")}, nil); err != nil {
		t.Fatal(err)
	}
	if got := mustInstance(t, r, cfgA.Key()).HTTPPort; got != 9001 {
		t.Errorf("a after the config dropped it: port %d, want the source's 9001", got)
	}
	// A discovered instance follows its source: the admin API cannot deregister it.
	if err := r.Deregister(cfgA.Key()); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("deregister discovered instance: %v, want ErrInvalid", err)
	}
	// Removing the source removes what it declared.
	r.RemoveSource("k8s")
	if _, ok := r.Snapshot().Service("gw"); ok {
		t.Error("service of a removed source still published")
	}
	if _, ok := r.Snapshot().Instance(cfgA.Key()); ok {
		t.Error("instance of a removed source still published")
	}
}

func TestSourceFailedKeepsLastGoodSet(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("web")}, nil); err != nil {
		t.Fatal(err)
	}
	// A source that failed before it ever synced says so and publishes nothing.
	r.SourceFailed("k8s", "kubernetes", errors.New("forbidden"))
	if st := status(t, r, "k8s"); st.Synced || !st.Failing || st.LastError != "forbidden" || st.Errors != 1 {
		t.Errorf("status before first sync = %+v", st)
	}
	if err := r.UpdateSource("k8s", "kubernetes", nil, []registry.Instance{inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	gen := r.Snapshot().Generation
	r.SourceFailed("k8s", "kubernetes", errors.New("watch: connection refused"))
	if r.Snapshot().Generation != gen {
		t.Error("a failure published a new generation")
	}
	mustInstance(t, r, key("web", "a"))
	st := status(t, r, "k8s")
	if !st.Synced || !st.Failing || st.LastError != "watch: connection refused" || st.Errors != 2 || st.Instances != 1 {
		t.Errorf("status after failure = %+v, want synced, failing, the error, 2 errors, 1 instance", st)
	}
	if err := r.UpdateSource("k8s", "kubernetes", nil, []registry.Instance{inst("web", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	if st := status(t, r, "k8s"); st.Failing || st.LastError != "watch: connection refused" {
		t.Errorf("status after recovery = %+v, want not failing, last error kept", st)
	}
	if err := r.UpdateSource("config", "file", nil, nil); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("source named config: %v, want ErrInvalid", err)
	}
	if err := r.UpdateSource("k8s", "kubernetes", nil, []registry.Instance{{Service: "web", ID: "x"}}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("instance without address: %v, want ErrInvalid", err)
	}
}

func TestSourceStateAndHealth(t *testing.T) {
	r := registry.New()
	if err := r.Apply([]registry.Service{svc("web")}, nil); err != nil {
		t.Fatal(err)
	}
	c := inst("web", "c", 1)
	c.Health = registry.HealthHealthy
	update := func(in registry.Instance) {
		t.Helper()
		if err := r.UpdateSource("k8s", "kubernetes", nil, []registry.Instance{in}); err != nil {
			t.Fatal(err)
		}
	}
	update(c)
	// An operator drains it; the source repeating "active" does not undo that.
	if err := r.SetState(c.Key(), registry.StateDraining); err != nil {
		t.Fatal(err)
	}
	update(c)
	if got := mustInstance(t, r, c.Key()).State; got != registry.StateDraining {
		t.Errorf("operator's drain after an unchanged source update: %s", got)
	}
	// The source changes the state itself (terminating, then ready again): it wins.
	c.State = registry.StateDraining
	update(c)
	c.State = registry.StateActive
	update(c)
	if got := mustInstance(t, r, c.Key()).State; got != registry.StateActive {
		t.Errorf("source went back to active: state %s, want active", got)
	}
	// Health: either the source (not ready) or the active check saying unhealthy wins.
	if changed, err := r.SetHealth(c.Key(), registry.HealthUnhealthy); err != nil || !changed {
		t.Fatalf("SetHealth unhealthy: changed %v, %v", changed, err)
	}
	update(c) // the source still says healthy
	if got := mustInstance(t, r, c.Key()).Health; got != registry.HealthUnhealthy {
		t.Errorf("check says unhealthy, source healthy: %s, want unhealthy", got)
	}
	if _, err := r.SetHealth(c.Key(), registry.HealthHealthy); err != nil {
		t.Fatal(err)
	}
	c.Health = registry.HealthUnhealthy
	update(c)
	if got := mustInstance(t, r, c.Key()).Health; got != registry.HealthUnhealthy {
		t.Errorf("source says unhealthy, check healthy: %s, want unhealthy", got)
	}
	if changed, _ := r.SetHealth(c.Key(), registry.HealthUnknown); changed {
		t.Error("forgetting the check's verdict changed health though the source says unhealthy")
	}
	c.Health = registry.HealthUnknown
	update(c)
	if got := mustInstance(t, r, c.Key()).Health; got != registry.HealthUnknown {
		t.Errorf("nobody has a verdict: %s, want unknown", got)
	}
}

func status(t *testing.T, r *registry.Registry, name string) registry.SourceStatus {
	t.Helper()
	for _, s := range r.Sources() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no source %q in %+v", name, r.Sources())
	return registry.SourceStatus{}
}
