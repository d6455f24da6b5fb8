package backup

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// TestStaleReadKeepsRunningBackup: a pass that reads the Backup before its
// Running status reached the cache (phase empty, its target gone by now)
// does not write Failed or Pending over the Running status, Job and
// location already stored; it is tried again on a fresh read.
func TestStaleReadKeepsRunningBackup(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	stored := testBackup("nightly", "abcd")
	stored.Status = v1alpha1.BackupStatus{Phase: v1alpha1.BackupRunning, Job: "backup-nightly-1", Location: "shop/postgres/orders/x"}
	stale := stored.DeepCopy()
	stale.Status = v1alpha1.BackupStatus{}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(stored).WithStatusSubresource(&v1alpha1.Backup{}).Build()
	current := &v1alpha1.Backup{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(stored), current); err != nil {
		t.Fatal(err)
	}
	stale.ResourceVersion = "1" // older than what the store holds
	if current.ResourceVersion == stale.ResourceVersion {
		t.Fatalf("the stored Backup's resourceVersion %s is not newer than the stale copy's", current.ResourceVersion)
	}
	reads := 0
	staleClient := interceptor.NewClient(c, interceptor.Funcs{Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if b, ok := obj.(*v1alpha1.Backup); ok && reads == 0 {
			reads++
			stale.DeepCopyInto(b)
			return nil
		}
		return cl.Get(ctx, key, obj, opts...)
	}})
	r := &BackupReconciler{Deps: Deps{Client: staleClient, Reader: staleClient, Recorder: record.NewFakeRecorder(10), Now: time.Now}}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: stored.Namespace, Name: stored.Name}})
	if err != nil || !res.Requeue {
		t.Errorf("the stale pass: %+v, %v; want it tried again", res, err)
	}
	got := &v1alpha1.Backup{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(stored), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1alpha1.BackupRunning || got.Status.Job != "backup-nightly-1" {
		t.Errorf("after a pass on a stale copy the Backup is %s (%s), job %q; want Running", got.Status.Phase, got.Status.Message, got.Status.Job)
	}
}

// TestMajorUpgradeStatusWriteFails: a status write of the major upgrade
// that the API server refuses fails the pass (to be tried again) rather
// than letting the release move to a volume the status does not name.
func TestMajorUpgradeStatusWriteFails(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	pg := testPostgres()
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pg).WithStatusSubresource(&v1alpha1.Postgres{}).Build()
	refusing := interceptor.NewClient(c, interceptor.Funcs{SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
		return apierrors.NewServiceUnavailable("etcd is down")
	}})
	m := &Major{Client: refusing, Reader: c}
	ch := &majorChange{pg: pg, from: "15", to: "17", volume: "data", next: "data-pg17", job: "orders-major-17"}
	err := m.completed(context.Background(), pg, ch, &majorupgrade.Report{OK: true, Major: "17", Tables: 1, Databases: 1})
	if err == nil || !strings.Contains(err.Error(), "etcd is down") {
		t.Fatalf("completed with the status write refused: %v", err)
	}
}
