package patch

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// Nothing is written for an unchanged status; a change is; a change made
// on a stale copy is refused as a conflict, the newer status kept.
func TestStatus(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	writes := 0
	b := &v1alpha1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "nightly"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(b).WithStatusSubresource(b).WithInterceptorFuncs(interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			writes++
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		}}).Build()
	ctx := context.Background()
	read := func() *v1alpha1.Backup {
		got := &v1alpha1.Backup{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	cur := read()
	if changed, err := Status(ctx, c, cur.DeepCopy(), cur, "status"); changed || err != nil || writes != 0 {
		t.Fatalf("unchanged: changed %v, err %v, %d writes; want none", changed, err, writes)
	}
	stale := read()
	staleBefore := stale.DeepCopy()
	fresh := read()
	before := fresh.DeepCopy()
	fresh.Status.Phase = v1alpha1.BackupRunning
	if changed, err := Status(ctx, c, before, fresh, "status"); !changed || err != nil {
		t.Fatalf("a change: changed %v, err %v", changed, err)
	}
	stale.Status.Phase = v1alpha1.BackupFailed
	_, err := Status(ctx, c, staleBefore, stale, "status")
	if !apierrors.IsConflict(err) {
		t.Fatalf("a change on a stale copy: %v, want a conflict", err)
	}
	if got := read().Status.Phase; got != v1alpha1.BackupRunning {
		t.Errorf("phase %q after the stale write, want the newer %q", got, v1alpha1.BackupRunning)
	}
}
