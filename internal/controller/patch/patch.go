// Package patch writes the status of an object the one way every
// controller here does: only when it changed, as a merge patch from the
// copy it was read as, carrying that copy's resourceVersion (an
// optimistic lock). A pass on a stale copy then fails with a conflict
// instead of writing over a newer status, such as the release
// reconciler's conditions on the same Postgres.
package patch

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Status writes obj's status as it differs from before (a DeepCopy of obj
// as it was read); what names the write in its error. It writes nothing
// when the two statuses are equal (changed false). Every error is returned, a
// conflict as one (apierrors.IsConflict): the caller reads again.
func Status(ctx context.Context, c client.Client, before, obj client.Object, what string) (changed bool, err error) {
	if sameStatus(before, obj) {
		return false, nil
	}
	if err := c.Status().Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return true, fmt.Errorf("writing %s of %s: %w", what, obj.GetName(), err)
	}
	return true, nil
}

// sameStatus reports whether a and b have equal statuses (what neither
// can be converted to compare is taken as changed).
func sameStatus(a, b client.Object) bool {
	ua, errA := runtime.DefaultUnstructuredConverter.ToUnstructured(a)
	ub, errB := runtime.DefaultUnstructuredConverter.ToUnstructured(b)
	return errA == nil && errB == nil && equality.Semantic.DeepEqual(ua["status"], ub["status"])
}
