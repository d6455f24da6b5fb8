package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

var publicdbGVR = schema.GroupVersionResource{Group: "test.chartpilot.dev", Version: "v1alpha1", Resource: "publicdbs"}

// driftChecks reads chartpilot_drift_checks_total of kind and outcome from
// the in-process operators' registry.
func driftChecks(t *testing.T, kind, outcome string) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range mfs {
		if f.GetName() != "chartpilot_drift_checks_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == kind && labels["outcome"] == outcome {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// workloadsReady reports whether the StatefulSet and the Deployment of a
// publicdb release run every replica of their newest generation.
func (e *env) workloadsReady(name string) (bool, string) {
	ctx := context.Background()
	sts, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, name+"-publicdb", metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	dep, err := e.cs.AppsV1().Deployments(e.ns).Get(ctx, name+"-publicdb-proxy", metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	stsReady := sts.Status.ObservedGeneration == sts.Generation && sts.Status.ReadyReplicas == *sts.Spec.Replicas &&
		sts.Status.UpdatedReplicas == *sts.Spec.Replicas && sts.Status.CurrentRevision == sts.Status.UpdateRevision
	depReady := dep.Status.ObservedGeneration == dep.Generation && dep.Status.AvailableReplicas == *dep.Spec.Replicas &&
		dep.Status.UpdatedReplicas == *dep.Spec.Replicas
	return stsReady && depReady, fmt.Sprintf("StatefulSet %+v, Deployment %+v", sts.Status, dep.Status)
}

// waitPublicdbReady waits until the workloads are ready, then until the
// resource is Ready on its generation, and returns how long the second
// wait took.
func (e *env) waitPublicdbReady(name string) time.Duration {
	e.t.Helper()
	e.waitFor(name+"'s workloads ready", 3*time.Minute, func() (bool, string) { return e.workloadsReady(name) })
	since := time.Now()
	e.waitFor(name+" Ready", 2*time.Minute, func() (bool, string) {
		u, err := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return ready(u)
	})
	return time.Since(since)
}

// requestReconcile sets the reconcile-requested-at annotation, which checks
// drift, and waits until a drift check of the kind has run.
func (e *env) requestReconcile(name, token string) {
	e.t.Helper()
	before := driftChecks(e.t, "Publicdb", "none") + driftChecks(e.t, "Publicdb", "corrected") + driftChecks(e.t, "Publicdb", "failed")
	body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationReconcileRequestedAt, token)
	if err := e.patch(publicdbGVR, name, body); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor("a drift check after "+token, 2*time.Minute, func() (bool, string) {
		n := driftChecks(e.t, "Publicdb", "none") + driftChecks(e.t, "Publicdb", "corrected") + driftChecks(e.t, "Publicdb", "failed")
		return n > before, fmt.Sprintf("%v drift checks", n-before)
	})
}

// TestPublicStyleChartLifecycle installs, checks, upgrades and deletes a
// chart written the way widely used public charts are (test/charts/publicdb:
// nulls, empty lists and maps, explicit false, non-canonical quantities, a
// StatefulSet with a claim template and maxUnavailable, pods without
// chartpilot's labels). What the API server drops from such a rendering is
// neither a reason to wait (the resource is Ready as soon as its workloads
// are) nor drift, while a deleted object, a changed image or a changed
// replica count still is.
func TestPublicStyleChartLifecycle(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	db := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.chartpilot.dev/v1alpha1", "kind": "Publicdb",
		"metadata": map[string]any{"name": "db1", "namespace": e.ns},
		"spec":     map[string]any{},
	}}
	if _, err := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Create(ctx, db, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := e.waitPublicdbReady("db1")
	t.Logf("Ready %s after the workloads were", took.Round(100*time.Millisecond))

	// No drift after the install, on a check asked for.
	if n := driftChecks(t, "Publicdb", "corrected"); n != 0 {
		t.Fatalf("%v drift corrections after the install", n)
	}
	e.requestReconcile("db1", "after-install")
	if n := driftChecks(t, "Publicdb", "corrected") + driftChecks(t, "Publicdb", "failed"); n != 0 {
		t.Fatalf("an untouched install was found drifted %v times: %v", n, condition(e.get(publicdbGVR, "db1"), v1alpha1.ConditionDrifted))
	}

	// A real change is still drift, and is set back.
	sts := e.cs.AppsV1().StatefulSets(e.ns)
	if _, err := sts.Patch(ctx, "db1-publicdb", types.StrategicMergePatchType,
		[]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"postgresql","image":"registry.example/other:1"}]}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("db1", "DriftCorrected", "StatefulSet/"+e.ns+"/db1-publicdb")
	e.waitFor("the image set back", time.Minute, func() (bool, string) {
		s, err := sts.Get(ctx, "db1-publicdb", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		img := s.Spec.Template.Spec.Containers[0].Image
		return img == "registry.example/publicdb/postgresql:16.4", img
	})
	deps := e.cs.AppsV1().Deployments(e.ns)
	if _, err := deps.Patch(ctx, "db1-publicdb-proxy", types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the replica count set back", time.Minute, func() (bool, string) {
		d, err := deps.Get(ctx, "db1-publicdb-proxy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return *d.Spec.Replicas == 1 && driftChecks(t, "Publicdb", "corrected") >= 2, fmt.Sprintf("replicas %d", *d.Spec.Replicas)
	})
	if err := e.cs.CoreV1().Services(e.ns).Delete(ctx, "db1-publicdb-hl", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("db1", "DriftCorrected", "Service/"+e.ns+"/db1-publicdb-hl (deleted)")
	if _, err := e.cs.CoreV1().Services(e.ns).Get(ctx, "db1-publicdb-hl", metav1.GetOptions{}); err != nil {
		t.Fatalf("the deleted Service was not created again: %v", err)
	}
	took = e.waitPublicdbReady("db1")
	t.Logf("Ready again %s after drift corrections", took.Round(100*time.Millisecond))

	// An upgrade (a new configuration rolls the StatefulSet's pods).
	if err := e.patch(publicdbGVR, "db1", `{"spec":{"config":{"maxConnections":"200"},"proxy":{"replicaCount":2}}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("revision 2", 2*time.Minute, func() (bool, string) {
		u := e.get(publicdbGVR, "db1")
		rev, _, _ := unstructured.NestedInt64(u.Object, "status", "release", "revision")
		return rev == 2, fmt.Sprintf("revision %d", rev)
	})
	took = e.waitPublicdbReady("db1")
	t.Logf("upgrade Ready %s after the workloads were", took.Round(100*time.Millisecond))
	cm, err := e.cs.CoreV1().ConfigMaps(e.ns).Get(ctx, "db1-publicdb-configuration", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["postgresql.conf"], "max_connections = 200") {
		t.Fatalf("configuration after the upgrade: %v %v", cm.Data, err)
	}
	before := driftChecks(t, "Publicdb", "corrected")
	e.requestReconcile("db1", "after-upgrade")
	if n := driftChecks(t, "Publicdb", "corrected") - before; n != 0 {
		t.Fatalf("an untouched upgrade was found drifted: %v", condition(e.get(publicdbGVR, "db1"), v1alpha1.ConditionDrifted))
	}

	// Delete: the release goes, the data volume stays.
	if err := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Delete(ctx, "db1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("db1 and its workloads gone", 2*time.Minute, func() (bool, string) {
		_, errR := e.dyn.Resource(publicdbGVR).Namespace(e.ns).Get(ctx, "db1", metav1.GetOptions{})
		_, errS := sts.Get(ctx, "db1-publicdb", metav1.GetOptions{})
		_, errD := deps.Get(ctx, "db1-publicdb-proxy", metav1.GetOptions{})
		return apierrors.IsNotFound(errR) && apierrors.IsNotFound(errS) && apierrors.IsNotFound(errD), fmt.Sprint(errR, errS, errD)
	})
	if claims := e.pvcs("app.kubernetes.io/instance=db1"); len(claims) != 1 {
		t.Errorf("data claims after delete: %d, want 1 (kept)", len(claims))
	}
}
