package deploytest

import (
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/tether-dev/tether/deploy/test/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

var chartDir = filepath.Join(root, "deploy/helm/tether")

// renderChart renders the chart as `helm template tether -n tether` does, with values (nil
// for the defaults) checked against values.schema.json.
func renderChart(t *testing.T, values map[string]any) ([]byte, error) {
	t.Helper()
	return render.Helm(chartDir, values, "tether")
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// chartCases are the value sets the chart is tested with.
func chartCases(t *testing.T) []struct {
	name   string
	values map[string]any
	ha     bool
} {
	return []struct {
		name   string
		values map[string]any
		ha     bool
	}{
		{"default", nil, false},
		{"ha", readValues(t, filepath.Join(chartDir, "ci/ha-values.yaml")), true},
	}
}

// TestHelmLint runs Helm's own chart linter (Chart.yaml, values against the schema, every
// template rendered and parsed) for the default and the HA values; any finding fails.
func TestHelmLint(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			res := lint.AllWithKubeVersion(chartDir, c.values, "tether", &render.KubeVersion)
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

// TestHelmChart renders the chart for the default and the HA values, decodes every object
// strictly into its Kubernetes Go type, validates the ConfigMap's tether config with
// pkg/config (with the mounted token and password files in place), and checks what the chart
// promises: named ports shared by the pod and the Service, probes on /healthz, /readyz and
// gRPC health, a non-root read-only securityContext, resources, topology spread, and for HA
// three replicas on Redis with a PodDisruptionBudget, a ServiceMonitor and the EndpointSlice
// RBAC of Kubernetes discovery.
func TestHelmChart(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			out, err := renderChart(t, c.values)
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeStrict(t, "helm "+c.name, out)
			checkManifests(t, objs, c.ha)
			if c.ha {
				checkGatewayAPIRBAC(t, objs)
			}
		})
	}
}

// checkManifests asserts the chart's (and the kustomize base's) promises on decoded objects.
func checkManifests(t *testing.T, objs []object, ha bool) {
	t.Helper()
	cfg := checkTether(t, objs)
	dep := one[*appsv1.Deployment](t, objs, "Deployment")
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]

	wantReplicas := int32(1)
	if ha {
		wantReplicas = 3
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != wantReplicas {
		t.Errorf("replicas %v; want %d", dep.Spec.Replicas, wantReplicas)
	}

	// Named ports: the container's and the Service's, and the config's listeners on them.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, listener := range map[string]string{"extproc": cfg.Listeners.ExtProc, "xds": cfg.Listeners.XDS, "api": cfg.Listeners.API} {
		p, ok := ports[name]
		if !ok {
			t.Errorf("no container port named %s (ports %v)", name, ports)
			continue
		}
		if want := "0.0.0.0:" + strconv.Itoa(int(p)); listener != want {
			t.Errorf("listener for %s is %q; want %q (the container port)", name, listener, want)
		}
	}
	svc := one[*corev1.Service](t, objs, "Service")
	for _, sp := range svc.Spec.Ports {
		if _, ok := ports[sp.TargetPort.StrVal]; !ok {
			t.Errorf("Service port %s targets %q, not a named container port", sp.Name, sp.TargetPort.String())
		}
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not select the pods (%v)", k, v, dep.Spec.Template.Labels)
		}
	}

	// Probes: gRPC health and HTTP checks in plain text; HTTPS checks under TLS.
	scheme := corev1.URISchemeHTTP
	if cfg.TLS.CertFile != "" {
		scheme = corev1.URISchemeHTTPS
	}
	if plain := cfg.TLS.CertFile == ""; plain != cfg.Listeners.AllowInsecure {
		t.Errorf("tls.certFile %q with listeners.allowInsecure %v: want exactly one", cfg.TLS.CertFile, cfg.Listeners.AllowInsecure)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.StrVal != "api" || p.HTTPGet.Scheme != scheme {
		t.Errorf("liveness probe %+v; want GET /healthz on port api over %s", p, scheme)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.StrVal != "api" || p.HTTPGet.Scheme != scheme {
		t.Errorf("readiness probe %+v; want GET /readyz on port api over %s", p, scheme)
	}
	switch p := c.StartupProbe; {
	case p == nil:
		t.Error("no startup probe")
	case scheme == corev1.URISchemeHTTP && (p.GRPC == nil || p.GRPC.Port != ports["extproc"]):
		t.Errorf("startup probe %+v; want gRPC health on the ext_proc port", p)
	case scheme == corev1.URISchemeHTTPS && (p.HTTPGet == nil || p.HTTPGet.Scheme != scheme):
		t.Errorf("startup probe %+v; want an HTTPS check (the kubelet's gRPC probe has no TLS)", p)
	}

	// Security: non-root, read-only root filesystem, no privilege escalation, no capabilities.
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v; want runAsNonRoot with a non-zero uid", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v; want readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v; want cpu and memory requests and a memory limit", c.Resources)
	}
	if len(pod.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints")
	}

	checkLifecycle(t, dep, cfg)

	pdbs := find[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget")
	sms := find[*monitoringv1.ServiceMonitor](t, objs, "ServiceMonitor")
	roles := find[*rbacv1.Role](t, objs, "Role")
	if !ha {
		if n := len(find[*rbacv1.ClusterRole](t, objs, "ClusterRole")); len(pdbs)+len(sms)+len(roles)+n != 0 {
			t.Errorf("default values render %d PDBs, %d ServiceMonitors, %d Roles, %d ClusterRoles; want none", len(pdbs), len(sms), len(roles), n)
		}
		if cfg.Store.SnapshotPath == "" {
			t.Error("the embedded store takes no snapshots")
		}
		return
	}
	if len(pdbs) != 1 || pdbs[0].Spec.MaxUnavailable == nil {
		t.Errorf("PodDisruptionBudgets %v; want one with maxUnavailable", pdbs)
	}
	if len(sms) != 1 || len(sms[0].Spec.Endpoints) != 1 || sms[0].Spec.Endpoints[0].Port != "api" || sms[0].Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitors %+v; want one scraping /metrics on port api", sms)
	} else if sms[0].Spec.Endpoints[0].HonorLabels {
		// tether's labels (tether_service, tether_instance) collide with no target label.
		t.Error("the ServiceMonitor sets honorLabels: the target's instance/job would be lost")
	}
	var watch bool
	for _, r := range roles {
		for _, rule := range r.Rules {
			if slices.Contains(rule.APIGroups, "discovery.k8s.io") && slices.Contains(rule.Resources, "endpointslices") &&
				slices.Contains(rule.Verbs, "list") && slices.Contains(rule.Verbs, "watch") {
				watch = true
			}
		}
	}
	if !watch || len(find[*rbacv1.RoleBinding](t, objs, "RoleBinding")) != len(roles) {
		t.Errorf("Roles %+v: want list/watch on discovery.k8s.io endpointslices, each bound", roles)
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Error("discovery needs the service account token mounted")
	}
	if cfg.Store.Backend != "redis" || len(cfg.Store.Redis.Addresses) != 1 || cfg.Store.Redis.Addresses[0] != "redis-master.redis.svc:6379" || cfg.Store.Redis.PasswordFile == "" {
		t.Errorf("HA config does not use Redis: %+v", cfg.Store)
	}
	if cfg.TLS.CertFile == "" {
		t.Error("HA config serves no TLS")
	}
}

// TestHelmValuesSchema checks that values.schema.json refuses bad values before anything
// renders, and names the offending value.
func TestHelmValuesSchema(t *testing.T) {
	for _, c := range []struct {
		name, want string
		values     string
	}{
		{"replicas not a number", "replicas", "replicas: three"},
		{"replicas zero", "replicas", "replicas: 0"},
		{"several replicas on the embedded store", "backend", "replicas: 3"},
		{"unknown backend", "backend", "store: {backend: etcd}"},
		{"redis without an address", "addresses", "store: {backend: redis, redis: {existingSecret: x}}"},
		{"redis address without a port", "addresses", "store: {backend: redis, redis: {addresses: [redis]}}"},
		{"port out of range", "extProc", "ports: {extProc: 70000}"},
		{"unknown value", "replicaCount", "replicaCount: 2"},
		{"listeners in config", "config", "config: {listeners: {api: 0.0.0.0:1}}"},
		{"bad token name", "name", "auth: {tokens: [{name: 'a b'}]}"},
		{"mutual TLS without a certificate", "existingSecret", "tls: {mutual: true}"},
		{"gateway API source selecting no routes", "gatewayAPI", "discovery: {gatewayAPI: {enabled: true}}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			_, err = renderChart(t, v)
			if err == nil {
				t.Fatalf("values %q rendered; want a schema error", c.values)
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q; want a schema error naming %q", err, c.want)
			}
		})
	}
	// The same machinery accepts good values (so the refusals above are the schema's doing).
	v, _ := chartutil.ReadValues([]byte("replicas: 2\nstore: {backend: redis, redis: {addresses: ['redis:6379']}}"))
	if _, err := renderChart(t, v); err != nil {
		t.Errorf("good values refused: %v", err)
	}
}

// checkGatewayAPIRBAC: with discovery.gatewayAPI (all namespaces) the chart binds a ClusterRole
// with exactly the rules of pkg/discovery/gatewayapi RBACRules (this module does not import
// tether, so they are spelled out here; the source's tests run with exactly those rules on a
// real API server), and the config turns the source on.
func checkGatewayAPIRBAC(t *testing.T, objs []object) {
	t.Helper()
	crs := find[*rbacv1.ClusterRole](t, objs, "ClusterRole")
	crbs := find[*rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding")
	if len(crs) != 1 || len(crbs) != 1 || crbs[0].RoleRef.Name != crs[0].Name || len(crbs[0].Subjects) != 1 || crbs[0].Subjects[0].Kind != "ServiceAccount" {
		t.Fatalf("ClusterRoles %+v, bindings %+v: want one, bound to the service account", crs, crbs)
	}
	got := map[string][]string{}
	for _, r := range crs[0].Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got[g+"/"+res] = append(got[g+"/"+res], r.Verbs...)
			}
		}
	}
	want := map[string][]string{
		"gateway.networking.k8s.io/httproutes":        {"get", "list", "watch"},
		"gateway.networking.k8s.io/gateways":          {"get", "list", "watch"},
		"gateway.networking.k8s.io/httproutes/status": {"update"},
		"/services":                       {"get", "list", "watch"},
		"discovery.k8s.io/endpointslices": {"get", "list", "watch"},
	}
	if !reflect.DeepEqual(want, got) {
		t.Errorf("gateway-api ClusterRole rules %v, want %v", got, want)
	}
	cm := find[*corev1.ConfigMap](t, objs, "ConfigMap")
	var on bool
	for _, c := range cm {
		on = on || strings.Contains(c.Data["tether.yaml"], "gatewayAPI:") && strings.Contains(c.Data["tether.yaml"], "- eg")
	}
	if !on {
		t.Error("the config does not enable discovery.gatewayAPI with the class eg")
	}
}

// checkLifecycle: a rolling update never takes a replica away before its successor is ready
// (maxUnavailable 0), a preStop hook that needs no shell (the sleep action) runs before SIGTERM,
// and the grace period covers the whole drain — the preStop sleep, Envoy's health check moving
// new streams away (read from tether's own bootstrap), shutdown.drainTimeout, and 20 s for the
// handoff and the listeners — so Kubernetes never kills a replica that is handing off.
func checkLifecycle(t *testing.T, dep *appsv1.Deployment, cfg *tetherConfig) {
	t.Helper()
	ru := dep.Spec.Strategy.RollingUpdate
	if dep.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v; want RollingUpdate with maxUnavailable 0", dep.Spec.Strategy)
	}
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	var sleep time.Duration
	switch lc := c.Lifecycle; {
	case lc == nil || lc.PreStop == nil || lc.PreStop.Sleep == nil:
		t.Errorf("lifecycle %+v; want a preStop sleep action (the image has no shell)", lc)
	case lc.PreStop.Exec != nil:
		t.Error("preStop exec: the image has no shell")
	default:
		sleep = time.Duration(lc.PreStop.Sleep.Seconds) * time.Second
	}
	drain, err := time.ParseDuration(cfg.Shutdown.DrainTimeout)
	if err != nil {
		t.Fatalf("shutdown.drainTimeout %q: %v (the manifests must set it: the grace period derives from it)", cfg.Shutdown.DrainTimeout, err)
	}
	need := sleep + cfg.moveAway + drain + 20*time.Second
	if pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %v; want at least %v (preStop %v + move-away %v + drainTimeout %v + 20s)",
			pod.TerminationGracePeriodSeconds, need, sleep, cfg.moveAway, drain)
	}
}
