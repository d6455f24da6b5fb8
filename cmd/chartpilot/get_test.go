package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// TestGet lists the resources of chartpilot's kinds from a real API
// server: Ready with the reason when not, chart deployed → desired,
// revision, the upgrade state; kinds that are not releases (backup stores)
// are left out; -o json carries the same.
func TestGet(t *testing.T) {
	cluster.Skip(t)
	ns := cluster.Namespace(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	pgGVR := schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "postgres"}
	redisGVR := schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "redis"}
	create := func(gvr schema.GroupVersionResource, kind, name string, spec map[string]any, st map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": kind, "metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
		made, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		if st != nil {
			made.Object["status"] = st
			if _, err := dyn.Resource(gvr).Namespace(ns).UpdateStatus(ctx, made, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("status of %s: %v", name, err)
			}
		}
	}
	pgSpec := map[string]any{"version": "17", "replicas": int64(1), "storage": map[string]any{"size": "1Gi"}}
	cond := func(typ, status, reason string) map[string]any {
		return map[string]any{"type": typ, "status": status, "reason": reason, "message": reason + " message", "lastTransitionTime": "2026-11-30T00:00:00Z", "observedGeneration": int64(1)}
	}
	create(pgGVR, "Postgres", "orders", pgSpec, map[string]any{
		"conditions": []any{cond("Ready", "True", "UpgradeSucceeded"), cond("Released", "True", "UpgradeSucceeded")},
		"chart":      map[string]any{"name": "postgresql", "deployedVersion": "0.1.0", "desiredVersion": "0.1.0"},
		"release":    map[string]any{"name": "orders", "revision": int64(3), "chartName": "postgresql", "chartVersion": "0.1.0", "status": "deployed"},
		"valuesLayers": []any{
			map[string]any{"name": "cr", "keys": []any{"image", "replicas", "storage"}},
			map[string]any{"name": "hook:tenancy", "keys": []any{"resources"}},
		},
		"history": []any{
			map[string]any{"action": "Upgrade", "revision": int64(3), "chartVersion": "0.1.0", "succeeded": true, "time": "2026-11-30T01:00:00Z", "message": "upgraded to postgresql 0.1.0 as revision 3"},
			map[string]any{"action": "Upgrade", "revision": int64(2), "chartVersion": "0.1.0", "succeeded": false, "time": "2026-11-30T00:30:00Z", "message": "Upgrade failed: timed out"},
		},
	})
	create(pgGVR, "Postgres", "billing", pgSpec, map[string]any{
		"conditions": []any{cond("Ready", "False", "UpgradeQueued"), cond("Reconciling", "True", "UpgradeQueued")},
		"chart":      map[string]any{"name": "postgresql", "deployedVersion": "0.1.0", "desiredVersion": "0.2.0"},
		"release":    map[string]any{"name": "billing", "revision": int64(1)},
	})
	create(redisGVR, "Redis", "sessions", map[string]any{}, nil)
	bs := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "BackupStore", "metadata": map[string]any{"name": "store", "namespace": ns},
		"spec": map[string]any{"volume": map[string]any{"claimName": "x"}}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "backupstores"}).Namespace(ns).Create(ctx, bs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A Tenant claiming the namespace, as the operator resolves it.
	tenantGVR := schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "tenants"}
	tn := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Tenant", "metadata": map[string]any{"name": ns + "-team"},
		"spec": map[string]any{"namespaces": []any{ns}}}}
	tn, err = dyn.Resource(tenantGVR).Create(ctx, tn, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Resource(tenantGVR).Delete(context.Background(), ns+"-team", metav1.DeleteOptions{}) })
	tn.Object["status"] = map[string]any{"namespaces": []any{ns}}
	if _, err := dyn.Resource(tenantGVR).UpdateStatus(ctx, tn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	bk := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Backup", "metadata": map[string]any{"name": "nightly", "namespace": ns},
		"spec": map[string]any{"target": map[string]any{"kind": "Postgres", "name": "orders"}, "store": map[string]any{"name": "store"}}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "backups"}).Namespace(ns).Create(ctx, bk, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if err := getCommand(ctx, append(args, "--kubeconfig", cluster.KubeconfigPath), &out, &errb, time.Now().Add(3*time.Hour)); err != nil {
			t.Fatalf("get %v: %v\n%s", args, err, errb.String())
		}
		return out.String()
	}
	out := run("-n", ns)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 resources (not the backup store, not the backup):\n%s", out)
	}
	for _, want := range []string{
		"Postgres  " + ns + "  billing   False (UpgradeQueued)  postgresql 0.1.0 → 0.2.0  1         UpgradeQueued  " + ns + "-team  3h",
		"Postgres  " + ns + "  orders    True                   postgresql 0.1.0          3         -              " + ns + "-team  3h",
		"Redis     " + ns + "  sessions  Unknown                -                         -         -              " + ns + "-team  3h",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing line %q in:\n%s", want, out)
		}
	}
	if out := run("pg", "-n", ns); strings.Contains(out, "sessions") || !strings.Contains(out, "orders") {
		t.Errorf("get pg lists other kinds or misses postgres:\n%s", out)
	}
	var rows []getRow
	if err := json.Unmarshal([]byte(run("postgres", "-n", ns, "-o", "json")), &rows); err != nil || len(rows) != 2 || rows[0].Name != "billing" || rows[0].Desired != "0.2.0" || rows[0].Reason != "UpgradeQueued" || rows[0].Tenant != ns+"-team" {
		t.Errorf("json: %+v (%v)", rows, err)
	}
	var yrows []getRow
	if err := yaml.Unmarshal([]byte(run("postgres", "-n", ns, "-o", "yaml")), &yrows); err != nil || len(yrows) != 2 || yrows[0].Name != "billing" || yrows[0].Desired != "0.2.0" {
		t.Errorf("yaml: %+v (%v)", yrows, err)
	}
	if out := run("-A"); !strings.Contains(out, ns) {
		t.Errorf("-A does not list %s", ns)
	}
	// rollout status: the fleet of a kind by version and state.
	var ro bytes.Buffer
	if err := rolloutCommand(ctx, []string{"status", "postgres", "-n", ns, "--kubeconfig", cluster.KubeconfigPath}, &ro, &bytes.Buffer{}); err != nil {
		t.Fatalf("rollout status: %v", err)
	}
	for _, want := range []string{"Postgres: 0 of 2 on chart version 0.2.0 and Ready", "0.1.0             2", "queued (maxConcurrentUpgrades)  1          " + ns + "/billing", "Ready on another version        1          " + ns + "/orders"} {
		if !strings.Contains(ro.String(), want) {
			t.Errorf("rollout status lacks %q:\n%s", want, ro.String())
		}
	}
	ro.Reset()
	if err := rolloutCommand(ctx, []string{"status", "postgres", "-n", ns, "--version", "0.1.0", "--kubeconfig", cluster.KubeconfigPath}, &ro, &bytes.Buffer{}); err != nil || !strings.Contains(ro.String(), "1 of 2 on chart version 0.1.0") {
		t.Errorf("rollout status --version 0.1.0: %v\n%s", err, ro.String())
	}

	// describe: conditions, release, history and the resource's events.
	pg, err := dyn.Resource(pgGVR).Namespace(ns).Get(ctx, "orders", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "orders.1", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Postgres", APIVersion: "chartpilot.dev/v1alpha1", Namespace: ns, Name: "orders", UID: pg.GetUID()},
		Reason:         "UpgradeSucceeded", Message: "upgraded to postgresql 0.1.0 as revision 3", Type: corev1.EventTypeNormal, Count: 1,
		LastTimestamp: metav1.Now(), FirstTimestamp: metav1.Now(),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var desc, errb bytes.Buffer
	if err := describeCommand(ctx, []string{"pg/orders", "-n", ns, "--kubeconfig", cluster.KubeconfigPath}, &desc, &errb, time.Now()); err != nil {
		t.Fatalf("describe: %v\n%s", err, errb.String())
	}
	for _, want := range []string{
		"Postgres " + ns + "/orders",
		"Release:     orders revision 3, postgresql 0.1.0 (deployed)",
		"Ready     True",
		"Upgrade  2         0.1.0  failed",
		"Upgrade  3         0.1.0  succeeded",
		"Normal  UpgradeSucceeded",
		"Values layers (later ones win; keys only):",
		"cr            image, replicas, storage",
		"hook:tenancy  resources",
	} {
		if !strings.Contains(desc.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, desc.String())
		}
	}
	if err := describeCommand(ctx, []string{"orders", "--kubeconfig", cluster.KubeconfigPath}, &bytes.Buffer{}, &bytes.Buffer{}, time.Now()); err == nil || !strings.Contains(err.Error(), "KIND/NAME") {
		t.Errorf("describe without a kind: %v", err)
	}

	if err := getCommand(ctx, []string{"nosuchkind", "--kubeconfig", cluster.KubeconfigPath}, &bytes.Buffer{}, &bytes.Buffer{}, time.Now()); err == nil || !strings.Contains(err.Error(), `no namespaced kind "nosuchkind"`) {
		t.Errorf("unknown kind: %v", err)
	}
}

// TestRolloutStates: the state of a resource in a rollout, from its row.
func TestRolloutStates(t *testing.T) {
	for _, tc := range []struct {
		row  getRow
		want string
	}{
		{getRow{Ready: "True", Deployed: "1.1.0"}, stateOnTarget},
		{getRow{Ready: "True", Deployed: "1.0.0"}, stateOtherReady},
		{getRow{Ready: "False", Upgrade: "RolloutHalted"}, stateHalted},
		{getRow{Ready: "False", Upgrade: "WaitingForCanaries"}, stateCanaries},
		{getRow{Ready: "False", Upgrade: "Upgrading"}, stateUpgrading},
		{getRow{Ready: "False", Upgrade: "MajorUpgradeBlocked"}, stateBlocked},
		{getRow{Ready: "False", Reason: "UpgradeFailed"}, stateFailed},
		{getRow{Ready: "False", Reason: "WorkloadsUnavailable", Deployed: "1.1.0"}, stateNotReady},
	} {
		if got := stateOfRow(tc.row, "1.1.0"); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.row, got, tc.want)
		}
	}
	if got := newestWanted([]getRow{{Desired: "1.9.0"}, {Desired: "1.10.0"}, {Deployed: "1.2.0"}}); got != "1.10.0" {
		t.Errorf("newest wanted = %s, want 1.10.0", got)
	}
}

// TestTenants lists Tenants with their status as the tenancy controller
// writes it.
func TestTenants(t *testing.T) {
	cluster.Skip(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "tenants"}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Tenant", "metadata": map[string]any{"name": "team-cli"},
		"spec": map[string]any{"namespaces": []any{"team-cli-a"}, "limits": map[string]any{"maxTotalStorage": "100Gi"}}}}
	made, err := dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Resource(gvr).Delete(context.Background(), "team-cli", metav1.DeleteOptions{}) })
	made.Object["status"] = map[string]any{"namespaces": []any{"team-cli-a"}, "resources": int64(3), "storageUsed": "30Gi", "violations": []any{"team-cli-a/big: storage 200Gi above maxStorage 50Gi"},
		"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "Claimed", "message": "ok", "lastTransitionTime": "2026-11-30T00:00:00Z"}}}
	if _, err := dyn.Resource(gvr).UpdateStatus(ctx, made, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tenantsCommand(ctx, []string{"--kubeconfig", cluster.KubeconfigPath}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"team-cli  True   team-cli-a  3          30Gi / 100Gi        1", "team-cli: team-cli-a/big: storage 200Gi above maxStorage 50Gi"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tenants lacks %q:\n%s", want, out.String())
		}
	}
}
