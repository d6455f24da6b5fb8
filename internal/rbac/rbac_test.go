package rbac

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/watches"
)

func TestRulesFromWatchesAndCharts(t *testing.T) {
	chart, err := filepath.Abs(filepath.Join("..", "..", "test", "charts", "webapp"))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := watches.Parse([]byte("- {group: test.chartpilot.dev, version: v1alpha1, kind: Webapp, chart: "+chart+", serviceAccountName: deployer}\n"), ".", os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join("..", "..", "test", "crds", "webapps.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	plurals, err := Plurals(crd)
	if err != nil || plurals[schema.GroupKind{Group: "test.chartpilot.dev", Kind: "Webapp"}] != "webapps" {
		t.Fatalf("plurals %v, %v", plurals, err)
	}
	rules, err := Rules(Options{Watches: ws, Impersonate: []string{"deployer", "deployer"}, WebhookConfiguration: "hook", KubeVersion: "v1.37.2", Plurals: plurals})
	if err != nil {
		t.Fatal(err)
	}
	grants := func(group, resource, verb string) *rbacv1.PolicyRule {
		for i, r := range rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return &rules[i]
			}
		}
		return nil
	}
	for _, want := range []struct{ group, resource, verb string }{
		{"test.chartpilot.dev", "webapps", "watch"}, {"test.chartpilot.dev", "webapps/status", "patch"}, {"test.chartpilot.dev", "webapps/finalizers", "update"},
		{"", "configmaps", "create"}, {"", "services", "delete"}, {"apps", "deployments", "patch"},
		{"batch", "jobs", "create"},                             // a hook, rendered only with slowHook
		{"rbac.authorization.k8s.io", "clusterroles", "create"}, // behind a condition, read from the template
		{"", "secrets", "create"}, {"coordination.k8s.io", "leases", "update"}, {"", "events", "create"},
	} {
		if grants(want.group, want.resource, want.verb) == nil {
			t.Errorf("no rule grants %s on %s.%s", want.verb, want.resource, want.group)
		}
	}
	if r := grants("", "serviceaccounts", "impersonate"); r == nil || !slices.Equal(r.ResourceNames, []string{"deployer"}) {
		t.Errorf("impersonation rule %+v, want resourceNames [deployer]", r)
	}
	if r := grants("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch"); r == nil || !slices.Equal(r.ResourceNames, []string{"hook"}) {
		t.Errorf("webhook rule %+v, want resourceNames [hook]", r)
	}
	for _, r := range rules {
		for _, f := range [][]string{r.APIGroups, r.Resources, r.Verbs} {
			if slices.Contains(f, "*") {
				t.Errorf("a rule uses *: %+v", r)
			}
		}
		if slices.Contains(r.Verbs, "escalate") || slices.Contains(r.Verbs, "bind") {
			t.Errorf("a rule grants escalate or bind: %+v", r)
		}
	}
	if out, err := Render(Options{Watches: ws, KubeVersion: "v1.37.2", ServiceAccountNamespace: "ops", ServiceAccountName: "manager"}); err != nil || !strings.Contains(string(out), "kind: ClusterRoleBinding") {
		t.Errorf("Render: %v\n%s", err, out)
	}
}
