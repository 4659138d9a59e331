package deploytest

import (
	"reflect"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestHelmEnvAndGOMEMLIMIT renders the chart with Helm's own renderer and decodes the
// Deployment strictly: GOMEMLIMIT defaults to 90% of the memory limit (whole MiB), follows the
// limit, can be set, turned off or overridden by an env entry; env (sorted) and extraEnv (as
// written, valueFrom included) reach the container; image.digest pins the image.
func TestHelmEnvAndGOMEMLIMIT(t *testing.T) {
	pod := corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}
	for _, c := range []struct {
		name, values string
		want         []corev1.EnvVar
		image        string
	}{
		{"default: 90% of 512Mi", "", []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "460MiB"}}, "ghcr.io/tether-dev/tether:"},
		{"follows a Gi limit", "resources: {limits: {memory: 1Gi}}", []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "921MiB"}}, ""},
		{"follows a decimal-unit limit", "resources: {limits: {memory: 2G}}", []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "1716MiB"}}, ""},
		{"no memory limit: unset", "resources: {limits: null}", nil, ""},
		{"turned off", `goMemLimit: ""`, nil, ""},
		{"set", "goMemLimit: 400MiB", []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "400MiB"}}, ""},
		{"env and extraEnv", "env: {TZ: UTC, A_FIRST: '1'}\nextraEnv: [{name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]",
			[]corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "460MiB"}, {Name: "A_FIRST", Value: "1"}, {Name: "TZ", Value: "UTC"}, {Name: "POD", ValueFrom: &pod}}, ""},
		{"an env GOMEMLIMIT wins", "env: {GOMEMLIMIT: 300MiB}", []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "300MiB"}}, ""},
		{"pinned by digest", "image: {digest: sha256:" + strings.Repeat("ab", 32) + "}", []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "460MiB"}},
			"ghcr.io/tether-dev/tether@sha256:" + strings.Repeat("ab", 32)},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			out, err := renderChart(t, v)
			if err != nil {
				t.Fatal(err)
			}
			dep := one[*appsv1.Deployment](t, decodeStrict(t, "helm "+c.name, out), "Deployment")
			ctr := dep.Spec.Template.Spec.Containers[0]
			if !reflect.DeepEqual(c.want, ctr.Env) {
				t.Errorf("env %+v; want %+v", ctr.Env, c.want)
			}
			if c.image != "" && !strings.HasPrefix(ctr.Image, c.image) || strings.HasSuffix(c.image, ":") && strings.Contains(ctr.Image, "@") {
				t.Errorf("image %q; want %q", ctr.Image, c.image)
			}
		})
	}
	for _, c := range []struct{ name, values, want string }{
		{"digest not a digest", "image: {digest: latest}", "digest"},
		{"goMemLimit a percentage", "goMemLimit: 90%", "goMemLimit"},
		{"env name with a space", "env: {'A B': x}", "A B"},
		{"env value not a string", "env: {A: 1}", "env"},
		{"extraEnv without a name", "extraEnv: [{value: x}]", "extraEnv"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := renderChart(t, v); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("values %q: error %v; want a schema error naming %s", c.values, err, c.want)
			}
		})
	}
	// A limit auto cannot read is refused with what to do, not rendered wrong.
	v, _ := chartutil.ReadValues([]byte("resources: {limits: {memory: 0.5Gi}}"))
	if _, err := renderChart(t, v); err == nil || !strings.Contains(err.Error(), "set goMemLimit") {
		t.Errorf("limit 0.5Gi: error %v; want one saying to set goMemLimit", err)
	}
}
