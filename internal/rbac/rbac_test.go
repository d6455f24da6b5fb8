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

// TestLockdownRules: with a deployer, the manager's ClusterRole creates no
// Secret, Pod, ServiceAccount or other kind of the charts anywhere and may
// impersonate the deployer; the deployer ClusterRole holds those writes and
// every rule of the Roles the charts make (so that it may create them),
// also of a Role behind a condition the default values leave off.
func TestLockdownRules(t *testing.T) {
	ws, err := watches.Load(filepath.Join("..", "..", "watches.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Watches: ws, Deployer: DefaultDeployer, KubeVersion: "v1.37.2"}
	manager, err := Rules(o)
	if err != nil {
		t.Fatal(err)
	}
	deployer, err := DeployerRules(o)
	if err != nil {
		t.Fatal(err)
	}
	grants := func(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
		for _, r := range rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0 {
				return true
			}
		}
		return false
	}
	for _, w := range []struct{ group, resource string }{
		{"", "secrets"}, {"", "pods"}, {"", "serviceaccounts"}, {"", "configmaps"}, {"apps", "statefulsets"},
		{"rbac.authorization.k8s.io", "roles"}, {"rbac.authorization.k8s.io", "rolebindings"}, {"batch", "jobs"}, {"", "persistentvolumeclaims"},
	} {
		for _, verb := range []string{"create", "update", "delete"} {
			if grants(manager, w.group, w.resource, verb) {
				t.Errorf("locked down, the manager may %s %s.%s in every namespace", verb, w.resource, w.group)
			}
		}
		if !grants(deployer, w.group, w.resource, "create") {
			t.Errorf("the deployer may not create %s.%s", w.resource, w.group)
		}
	}
	if !grants(manager, "apps", "statefulsets", "watch") || !grants(manager, "", "secrets", "list") {
		t.Error("locked down, the manager may not read the charts' kinds")
	}
	// The failover Role of the PostgreSQL chart (failover.enabled is false by default).
	for _, w := range []struct{ group, resource, verb string }{{"coordination.k8s.io", "leases", "update"}, {"coordination.k8s.io", "leases", "create"}, {"", "pods", "patch"}, {"", "events", "create"}} {
		if !grants(deployer, w.group, w.resource, w.verb) {
			t.Errorf("the deployer may not %s %s.%s, which the charts' Roles grant", w.verb, w.resource, w.group)
		}
	}
	var impersonate *rbacv1.PolicyRule
	for i, r := range manager {
		if slices.Equal(r.Verbs, []string{"impersonate"}) {
			impersonate = &manager[i]
		}
	}
	if impersonate == nil || !slices.Equal(impersonate.ResourceNames, []string{DefaultDeployer}) {
		t.Errorf("impersonation rule %+v, want resourceNames [%s]", impersonate, DefaultDeployer)
	}
	out, err := Render(Options{Watches: ws, Deployer: DefaultDeployer, KubeVersion: "v1.37.2", ServiceAccountNamespace: "ops", ServiceAccountName: "manager"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: Role\n", "kind: RoleBinding\n", "  name: deployer\n", "  namespace: ops\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("Render locked down has no %q", want)
		}
	}
}
