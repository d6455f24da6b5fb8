package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// TestOperatorChartInstallsAndRuns installs charts/chartpilot with the Helm
// SDK (every object accepted by the API server; the pods are simulated),
// runs the operator as a process with the credentials of the chart's
// ServiceAccount (a token from the TokenRequest API), so under exactly the
// chart's RBAC, through a Postgres and a Redis lifecycle; then uninstalls
// the chart: the resources it managed, their releases and their data stay.
func TestOperatorChartInstallsAndRuns(t *testing.T) {
	e := setup(t)
	e.stop() // the operator runs as a process with the chart's identity
	ctx := context.Background()
	ops := cluster.Namespace(t)
	release := "cp-" + ops[len(ops)-5:]
	ch, err := helm.LoadChart(filepath.Join("..", "..", "charts", "chartpilot"))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := helm.NewClient(cluster.Config, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	clusterKinds := []string{"ClusterRole.rbac.authorization.k8s.io", "ClusterRoleBinding.rbac.authorization.k8s.io",
		"ValidatingWebhookConfiguration.admissionregistration.k8s.io", "CustomResourceDefinition.apiextensions.k8s.io"}
	vals := map[string]any{
		"replicas": 1,
		// The test's own webhook serves the watched kinds: this one is
		// accepted by the API server but matches nothing.
		"webhook": map[string]any{"configurationName": "validating-" + release, "apiGroups": []any{"e2e.example.com"}, "failurePolicy": "Ignore"},
	}
	rel, err := hc.Install(ctx, ch, helm.ActionOptions{Namespace: ops, Name: release, Values: vals, Timeout: 2 * time.Minute, ClusterKinds: clusterKinds})
	if err != nil {
		t.Fatalf("installing charts/chartpilot: %v", err)
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_ = hc.Uninstall(helm.Scope{Namespace: ops, ClusterKinds: clusterKinds}, release, time.Minute)
		}
	})
	if rel.Status != helm.StatusDeployed {
		t.Fatalf("release %s: %s", release, rel.Status)
	}
	objs, _ := helm.ParseManifest(rel.Manifest)
	t.Logf("charts/chartpilot installed: %d objects", len(objs))
	fullname := release + "-chartpilot"
	if _, err := e.cs.AppsV1().Deployments(ops).Get(ctx, fullname, metav1.GetOptions{}); err != nil {
		t.Fatalf("the chart's Deployment: %v", err)
	}

	tok, err := e.cs.CoreV1().ServiceAccounts(ops).CreateToken(ctx, fullname, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the chart's ServiceAccount: %v", err)
	}
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = tok.Status.Token
	op := e.startOperatorProcessAs(cfg, ops)

	e.apply(postgresGVR, "Postgres", "db", map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}})
	e.apply(redisGVR, "Redis", "cache", map[string]any{"persistence": map[string]any{"enabled": true, "size": "1Gi"}})
	for _, r := range []struct{ gvr, name string }{{"postgres", "db"}, {"redis", "cache"}} {
		gvr := postgresGVR
		if r.gvr == "redis" {
			gvr = redisGVR
		}
		e.waitFor(r.name+" Ready under the chart's RBAC", 3*time.Minute, func() (bool, string) { return ready(e.get(gvr, r.name)) })
	}
	if err := e.patch(postgresGVR, "db", `{"spec":{"replicas":2}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("db Ready with 2 replicas", 3*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "db")
		ok, obs := ready(u)
		rr, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return ok && rr == 2, fmt.Sprintf("%s readyReplicas=%d", obs, rr)
	})
	if err := e.dyn.Resource(redisGVR).Namespace(e.ns).Delete(ctx, "cache", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("cache uninstalled", 3*time.Minute, func() (bool, string) {
		_, err := e.dyn.Resource(redisGVR).Namespace(e.ns).Get(ctx, "cache", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	// Uninstalling the operator leaves what it manages in place.
	_ = op.Process.Signal(syscall.SIGTERM)
	_ = op.Wait()
	if err := hc.Uninstall(helm.Scope{Namespace: ops, ClusterKinds: clusterKinds}, release, 2*time.Minute); err != nil {
		t.Fatalf("uninstalling charts/chartpilot: %v", err)
	}
	uninstalled = true
	if _, err := e.cs.AppsV1().Deployments(ops).Get(ctx, fullname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the operator's Deployment after uninstall: %v", err)
	}
	// A wrong deletion is given room to show.
	if ok, obs := e.holds(3*time.Second, func() (bool, string) { return ready(e.get(postgresGVR, "db")) }); !ok {
		t.Errorf("db after the operator's uninstall: %s", obs)
	}
	if sts, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "db", metav1.GetOptions{}); err != nil || sts.DeletionTimestamp != nil {
		t.Errorf("db's StatefulSet after the operator's uninstall: %v", err)
	}
	records, err := e.cs.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=db"})
	if err != nil || len(records.Items) == 0 {
		t.Errorf("db's release records after the operator's uninstall: %d, %v", len(records.Items), err)
	}
	if p := e.pvcs("app.kubernetes.io/instance=db"); len(p) != 2 {
		t.Errorf("db's data volumes after the operator's uninstall: %d, want 2", len(p))
	}
	if _, err := e.dyn.Resource(postgresGVR).Namespace(e.ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the Postgres CRD after the operator's uninstall: %v", err)
	}
}
