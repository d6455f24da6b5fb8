package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// chartpilotWrites are the writes chartpilot makes for one resource
// beside the chart's objects, as the bench saw them in the operator's run:
// its release record and its status, copied from one resource after the
// upgrade.
type chartpilotWrites struct {
	record []byte         // a release record's data
	status map[string]any // a resource's status
	cs     kubernetes.Interface
	dyn    dynamic.Interface
}

// captureWrites copies the release record of revision 2 and the status of
// resource name in namespace.
func captureWrites(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, namespace, name string) (*chartpilotWrites, error) {
	rec, err := cs.CoreV1().Secrets(namespace).Get(ctx, fmt.Sprintf("sh.helm.release.v1.%s.v2", name), metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	u, err := dyn.Resource(gvr).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	status, _ := u.Object["status"].(map[string]any)
	return &chartpilotWrites{record: rec.Data["release"], status: status}, nil
}

// captureWritesIf captures chartpilot's writes of the fleet's first
// resource when the direct baseline runs (nil when not).
func captureWritesIf(ctx context.Context, direct bool, cs kubernetes.Interface, dyn dynamic.Interface, namespace string) (*chartpilotWrites, error) {
	if !direct {
		return nil, nil
	}
	return captureWrites(ctx, cs, dyn, namespace, "app-0000")
}

// directWritesIf stops the operator and runs the baseline with
// chartpilot's writes when they were captured (nil when not).
func directWritesIf(ctx context.Context, c *testcluster.Cluster, root string, audit *testcluster.AuditLog, n, workers int, nsOf func(int) string, w *chartpilotWrites, stopOperator func()) (*directResult, error) {
	if w == nil {
		return nil, nil
	}
	stopOperator()
	logf("N=%d: the direct baseline with chartpilot's writes", n)
	d, err := runDirectWrites(ctx, c, root, audit, n, workers, nsOf, w)
	return &d, err
}

// runDirectWrites is the direct baseline with chartpilot's writes added
// for each name, made by the same clients in the order chartpilot makes
// them: the resource created (by its user) and its finalizer, the release
// record (pending, then deployed), the chart's objects, an event and the
// status; on a change the resource's spec, the new record, the objects,
// the older record superseded, the new one deployed, an event and two
// status writes (queued for an upgrade slot, then done); on deletion the
// objects, the records, an event and the finalizer. What remains between
// this and chartpilot is the operator itself: its CPU, its reads and the
// order in which it waits.
func runDirectWrites(ctx context.Context, c *testcluster.Cluster, root string, audit *testcluster.AuditLog, n, workers int, nsOf func(int) string, w *chartpilotWrites) (directResult, error) {
	kubeconfig, err := c.User(directUser, []string{"system:masters"})
	if err != nil {
		return directResult{}, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return directResult{}, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	if w.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return directResult{}, err
	}
	if w.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return directResult{}, err
	}
	return runDirectWith(ctx, c, root, audit, n, workers, nsOf, w)
}

// name is the resource (and release) name of the i-th object set.
func (w *chartpilotWrites) name(objs []*unstructured.Unstructured) (namespace, name string) {
	return objs[0].GetNamespace(), objs[0].GetLabels()["app.kubernetes.io/instance"]
}

func (w *chartpilotWrites) beforeCreate(ctx context.Context, objs []*unstructured.Unstructured) error {
	ns, name := w.name(objs)
	cr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": "Webapp",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"message": "hello"},
	}}
	if _, err := w.dyn.Resource(gvr).Namespace(ns).Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := w.patchCR(ctx, ns, name, fmt.Sprintf(`{"metadata":{"finalizers":[%q]}}`, v1alpha1.Finalizer)); err != nil {
		return err
	}
	return w.createRecord(ctx, ns, name, 1, "pending-install")
}

func (w *chartpilotWrites) afterCreate(ctx context.Context, objs []*unstructured.Unstructured) error {
	ns, name := w.name(objs)
	if err := w.updateRecord(ctx, ns, name, 1, "deployed"); err != nil {
		return err
	}
	return w.eventAndStatus(ctx, ns, name, "InstallSucceeded", 1)
}

func (w *chartpilotWrites) beforeBump(ctx context.Context, objs []*unstructured.Unstructured) error {
	ns, name := w.name(objs)
	if err := w.patchCR(ctx, ns, name, `{"spec":{"message":"hello again"}}`); err != nil {
		return err
	}
	if err := w.patchStatus(ctx, ns, name); err != nil { // queued for a slot
		return err
	}
	return w.createRecord(ctx, ns, name, 2, "pending-upgrade")
}

func (w *chartpilotWrites) afterBump(ctx context.Context, objs []*unstructured.Unstructured) error {
	ns, name := w.name(objs)
	if err := w.updateRecord(ctx, ns, name, 1, "superseded"); err != nil {
		return err
	}
	if err := w.updateRecord(ctx, ns, name, 2, "deployed"); err != nil {
		return err
	}
	return w.eventAndStatus(ctx, ns, name, "UpgradeSucceeded", 1)
}

func (w *chartpilotWrites) beforeDelete(ctx context.Context, objs []*unstructured.Unstructured) error {
	ns, name := w.name(objs)
	return w.dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
}

func (w *chartpilotWrites) afterDelete(ctx context.Context, objs []*unstructured.Unstructured) error {
	ns, name := w.name(objs)
	for rev := 1; rev <= 2; rev++ {
		if err := w.cs.CoreV1().Secrets(ns).Delete(ctx, recordName(name, rev), metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	if err := w.event(ctx, ns, name, "Uninstalled"); err != nil {
		return err
	}
	return w.patchCR(ctx, ns, name, `{"metadata":{"finalizers":null}}`)
}

func recordName(name string, rev int) string {
	return fmt.Sprintf("sh.helm.release.v1.%s.v%d", name, rev)
}

func (w *chartpilotWrites) createRecord(ctx context.Context, ns, name string, rev int, status string) error {
	_, err := w.cs.CoreV1().Secrets(ns).Create(ctx, w.recordSecret(name, rev, status), metav1.CreateOptions{})
	return err
}

func (w *chartpilotWrites) updateRecord(ctx context.Context, ns, name string, rev int, status string) error {
	_, err := w.cs.CoreV1().Secrets(ns).Update(ctx, w.recordSecret(name, rev, status), metav1.UpdateOptions{})
	return err
}

// recordSecret is a record as chartpilot writes it, with the captured
// data; labelled so that no informer of the operator's sees it.
func (w *chartpilotWrites) recordSecret(name string, rev int, status string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: recordName(name, rev), Labels: map[string]string{
			"owner": directLabel, "name": name, "status": status, "version": fmt.Sprint(rev),
		}},
		Type: "helm.sh/release.v1",
		Data: map[string][]byte{"release": w.record},
	}
}

func (w *chartpilotWrites) patchCR(ctx context.Context, ns, name, patch string) error {
	_, err := w.dyn.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (w *chartpilotWrites) patchStatus(ctx context.Context, ns, name string) error {
	u := &unstructured.Unstructured{Object: map[string]any{"status": w.status}}
	raw, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	_, err = w.dyn.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, raw, metav1.PatchOptions{}, "status")
	return err
}

func (w *chartpilotWrites) eventAndStatus(ctx context.Context, ns, name, reason string, statusWrites int) error {
	if err := w.event(ctx, ns, name, reason); err != nil {
		return err
	}
	for range statusWrites {
		if err := w.patchStatus(ctx, ns, name); err != nil {
			return err
		}
	}
	return nil
}

// event writes an event of the resource as the operator's recorder does.
func (w *chartpilotWrites) event(ctx context.Context, ns, name, reason string) error {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: name + ".", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{APIVersion: gvr.GroupVersion().String(), Kind: "Webapp", Namespace: ns, Name: name},
		Reason:         reason, Message: fmt.Sprintf("%s: release %s at revision 1", reason, name), Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "chartpilot"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	_, err := w.cs.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
	return err
}
