package storage

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestOwnedMember: only the StatefulSet's own pods, of its ordinals, lead
// the manager to a node's kubelet; a pod with its labels and name prefix
// made by someone else does not.
func TestOwnedMember(t *testing.T) {
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db", UID: types.UID("sts-uid")}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)}}
	pod := func(name string, uid types.UID, kind string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if uid != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "db", UID: uid, Controller: ptr.To(true)}}
		}
		return p
	}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want bool
	}{
		{pod("db-0", "sts-uid", "StatefulSet"), true},
		{pod("db-1", "sts-uid", "StatefulSet"), true},
		{pod("db-2", "sts-uid", "StatefulSet"), false},
		{pod("db-0", "", ""), false},
		{pod("db-0", "other", "StatefulSet"), false},
		{pod("db-0", "sts-uid", "ReplicaSet"), false},
		{pod("db-x", "sts-uid", "StatefulSet"), false},
		{pod("db-01", "sts-uid", "StatefulSet"), false},
		{pod("dbx-0", "sts-uid", "StatefulSet"), false},
	} {
		if got := ownedMember(tc.pod, sts); got != tc.want {
			t.Errorf("ownedMember(%s, owner %v) = %v, want %v", tc.pod.Name, tc.pod.OwnerReferences, got, tc.want)
		}
	}
}
