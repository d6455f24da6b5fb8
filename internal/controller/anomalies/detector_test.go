package anomalies

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

func pod(restarts, initRestarts int32, ready corev1.ConditionStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{InstanceLabel: "db", "secret-looking": "x"},
			Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Env: []corev1.EnvVar{{Name: "PASSWORD", Value: "hunter2"}}}}},
		Status: corev1.PodStatus{
			Phase:                 corev1.PodRunning,
			Conditions:            []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: ready, Message: "m"}},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "init", RestartCount: initRestarts}},
			ContainerStatuses:     []corev1.ContainerStatus{{Name: "a", RestartCount: restarts}, {Name: "b", RestartCount: 1}},
		},
	}
}

// The cache keeps of a pod what scoring reads, and nothing else (no spec,
// no annotations, no other label); restarts are summed over every
// container.
func TestTrimPod(t *testing.T) {
	out, err := trimPod(pod(2, 3, corev1.ConditionTrue))
	if err != nil {
		t.Fatal(err)
	}
	p := out.(*corev1.Pod)
	if len(p.Spec.Containers) != 0 || len(p.Annotations) != 0 || len(p.Labels) != 1 || p.Labels[InstanceLabel] != "db" {
		t.Errorf("trimmed pod keeps more than it reads: %+v", p)
	}
	if got := podOf(p); got.UID != "u" || got.Restarts != 6 || !got.Ready {
		t.Errorf("read from the trimmed pod: %+v", got)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.Conditions) != 1 {
		t.Errorf("status kept: %+v", p.Status)
	}
}

// Only changes of restarts or readiness wake the detector.
func TestPodChanged(t *testing.T) {
	pred := podChanged()
	trimmed := func(p *corev1.Pod) *corev1.Pod { o, _ := trimPod(p); return o.(*corev1.Pod) }
	for _, c := range []struct {
		name     string
		old, new *corev1.Pod
		want     bool
	}{
		{"nothing read changed", pod(1, 0, corev1.ConditionTrue), pod(1, 0, corev1.ConditionTrue), false},
		{"a restart", pod(1, 0, corev1.ConditionTrue), pod(2, 0, corev1.ConditionTrue), true},
		{"an init container's restart", pod(1, 0, corev1.ConditionTrue), pod(1, 1, corev1.ConditionTrue), true},
		{"unready", pod(1, 0, corev1.ConditionTrue), pod(1, 0, corev1.ConditionFalse), true},
	} {
		if got := pred.Update(event.TypedUpdateEvent[*corev1.Pod]{ObjectOld: trimmed(c.old), ObjectNew: trimmed(c.new)}); got != c.want {
			t.Errorf("%s: woken %v, want %v", c.name, got, c.want)
		}
	}
}
