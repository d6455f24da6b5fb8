package backup

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestPodMessageOnlyFromTheJobsPods: a pod that carries a Job's name
// label but is not controlled by the Job (anyone who may create pods in
// the namespace can make one) does not speak for it, even when newer.
func TestPodMessageOnlyFromTheJobsPods(t *testing.T) {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "backup-1", UID: types.UID("job-uid")}}
	pod := func(name string, owner *metav1.OwnerReference, created time.Time, message string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{"batch.kubernetes.io/job-name": job.Name}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: message}}}}}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	own := &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}
	other := &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: types.UID("someone-else"), Controller: ptr.To(true)}
	now := time.Now()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		pod("real", own, now, `{"real":true}`),
		pod("forged-unowned", nil, now.Add(time.Minute), `{"forged":true}`),
		pod("forged-other-uid", other, now.Add(2*time.Minute), `{"forged":true}`),
	).Build()
	if got := podMessage(context.Background(), c, job); got != `{"real":true}` {
		t.Errorf("podMessage = %q, want the Job's own pod's message", got)
	}
}
