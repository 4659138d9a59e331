package k8stest

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/tether-dev/tether/pkg/discovery/gatewayapi"
	"github.com/tether-dev/tether/pkg/discovery/kubernetes"
)

// The chart's RBAC (HA values: both discovery sources on) grants what each source declares it
// needs: the gateway-api ClusterRole exactly gatewayapi.RBACRules, the discovery Role at least
// kubernetes.RBACRules. The sources' own tests run with exactly those rules on a real API server.
func TestChartRBACMatchesTheSources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	manifests := renderTo(ctx, t, renderer(t), "tether", []string{"helm", "-f", root + "/deploy/helm/tether/ci/ha-values.yaml"}, "deploy/helm/tether")
	grants := map[string]map[string]bool{} // kind → "group/resource verb"
	for _, doc := range strings.Split(string(manifests), "\n---") {
		var obj struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "Role" || obj.Kind == "ClusterRole" {
			if grants[obj.Kind] == nil {
				grants[obj.Kind] = map[string]bool{}
			}
			for k := range flatten(t, obj.Rules) {
				grants[obj.Kind][k] = true
			}
		}
	}
	want := flatten(t, parseRules(t, gatewayapi.RBACRules))
	if len(want) == 0 || len(grants["ClusterRole"]) != len(want) {
		t.Errorf("ClusterRole grants %v, want exactly %v", grants["ClusterRole"], want)
	}
	for k := range want {
		if !grants["ClusterRole"][k] {
			t.Errorf("the gateway-api ClusterRole lacks %s", k)
		}
	}
	for k := range flatten(t, parseRules(t, kubernetes.RBACRules)) {
		if !grants["Role"][k] {
			t.Errorf("the discovery Role lacks %s (kubernetes.RBACRules)", k)
		}
	}
}

func parseRules(t *testing.T, y string) []rbacv1.PolicyRule {
	t.Helper()
	var rules []rbacv1.PolicyRule
	if err := yaml.Unmarshal([]byte(y), &rules); err != nil {
		t.Fatal(err)
	}
	return rules
}

func flatten(t *testing.T, rules []rbacv1.PolicyRule) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[g+"/"+res+" "+v] = true
				}
			}
		}
	}
	return out
}
