package helm

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestPostgresChartFailover: with failover, the pods run chartpilot's
// instance manager (copied in by an init container) around PostgreSQL,
// with an identity that may touch the cluster's Leases and label only its
// own pods, and the read-write Service selects the labelled primary.
func TestPostgresChartFailover(t *testing.T) {
	objs := renderKinds(t, "postgresql", map[string]any{"replicas": 3, "failover": map[string]any{"enabled": true, "synchronous": 1}})
	sts := objs["StatefulSet/db"]
	if sts == nil {
		t.Fatalf("no StatefulSet: %v", keys(objs))
	}
	containers, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
	pg := containers[0].(map[string]any)
	cmd, _, _ := unstructured.NestedStringSlice(pg, "command")
	joined := strings.Join(cmd, " ")
	for _, want := range []string{"/chartpilot/bin/chartpilot instance", "--cluster=db", "--bin=/usr/lib/postgresql/17/bin", "--address=$(POD_NAME).db-headless:5432", "--synchronous=1", "--config-file=/etc/postgresql/postgresql.conf"} {
		if !strings.Contains(joined, want) {
			t.Errorf("postgresql container command %q lacks %s", joined, want)
		}
	}
	inits, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "initContainers")
	if len(inits) != 1 || inits[0].(map[string]any)["name"] != "install-instance-manager" {
		t.Errorf("init containers %v, want only install-instance-manager", inits)
	}
	if sa, _, _ := unstructured.NestedString(sts.Object, "spec", "template", "spec", "serviceAccountName"); sa != "db-instance" {
		t.Errorf("pods run as %q", sa)
	}
	sel, _, _ := unstructured.NestedStringMap(objs["Service/db"].Object, "spec", "selector")
	if sel["chartpilot.dev/role"] != "primary" || sel["statefulset.kubernetes.io/pod-name"] != "" {
		t.Errorf("read-write Service selects %v", sel)
	}
	rules, _, _ := unstructured.NestedSlice(objs["Role/db-instance"].Object, "rules")
	named := map[string]string{} // resource and verbs -> names
	for _, r := range rules {
		res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
		names, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resourceNames")
		named[strings.Join(res, ",")+" "+strings.Join(verbs, ",")] = strings.Join(names, ",")
	}
	if got := named["pods patch"]; got != "db-0,db-1,db-2" {
		t.Errorf("the instance managers may patch pods %q, want only the cluster's", got)
	}
	if got := named["leases get,update"]; got != "db-primary,db-db-0,db-db-1,db-db-2" {
		t.Errorf("the instance managers may read and write Leases %q, want only the cluster's own", got)
	}
	if got, ok := named["leases list,create"]; !ok || got != "" {
		t.Errorf("listing and creating Leases: %q (%v), want a rule without names", got, ok)
	}
	// Without failover, pod 0 is the primary, as before.
	plain := renderKinds(t, "postgresql", map[string]any{"replicas": 3})
	if sel, _, _ := unstructured.NestedStringMap(plain["Service/db"].Object, "spec", "selector"); sel["statefulset.kubernetes.io/pod-name"] != "db-0" {
		t.Errorf("without failover the read-write Service selects %v", sel)
	}
	if plain["Role/db-instance"] != nil {
		t.Errorf("a Role for the instance managers without failover")
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
