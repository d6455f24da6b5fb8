package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

// podUIDs maps the pods of an instance to their UIDs.
func (e *env) podUIDs(instance string) map[string]string {
	e.t.Helper()
	pods, err := e.cs.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + instance})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		out[p.Name] = string(p.UID)
	}
	return out
}

// claimSizes lists the claims whose names start with prefix: name →
// "spec/status" sizes.
func (e *env) claimSizes(prefix string) map[string]string {
	e.t.Helper()
	list, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range list.Items {
		if strings.HasPrefix(c.Name, prefix) {
			req, capacity := c.Spec.Resources.Requests[corev1.ResourceStorage], c.Status.Capacity[corev1.ResourceStorage]
			out[c.Name] = req.String() + "/" + capacity.String()
		}
	}
	return out
}

func allSized(sizes map[string]string, n int, want string) bool {
	if len(sizes) != n {
		return false
	}
	for _, s := range sizes {
		if s != want+"/"+want {
			return false
		}
	}
	return true
}

func (e *env) templateSize(sts string) string {
	e.t.Helper()
	s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(context.Background(), sts, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	q := s.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]
	return q.String()
}

func revisionOf(u *unstructured.Unstructured) int64 {
	r, _, _ := unstructured.NestedInt64(u.Object, "status", "release", "revision")
	return r
}

// waitEvent waits for an event of reason on the resource whose message
// contains substr (events are written asynchronously).
func (e *env) waitEvent(name, reason, substr string) {
	e.t.Helper()
	e.waitFor("event "+reason, 2*time.Minute, func() (bool, string) {
		evs, err := e.cs.CoreV1().Events(e.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, substr) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		sort.Strings(seen)
		return false, strings.Join(seen, "; ")
	})
}

// growInPlace grows a resource's volumes and checks that the claims and
// the StatefulSet template follow, with the same pods and one revision.
func (e *env) growInPlace(gvr schema.GroupVersionResource, name, sts, claimPrefix string, claims int, patch, size string) {
	e.t.Helper()
	before := revisionOf(e.get(gvr, name))
	pods := e.podUIDs(name)
	if len(pods) != claims {
		e.t.Fatalf("%d pods before growing, want %d", len(pods), claims)
	}
	if err := e.patch(gvr, name, patch); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor("every claim at "+size+", the template too, Ready, StorageResizing=False", 4*time.Minute, func() (bool, string) {
		u := e.get(gvr, name)
		ok, obs := ready(u)
		sizes := e.claimSizes(claimPrefix)
		c := condition(u, v1alpha1.ConditionStorageResizing)
		resized := c != nil && c.Status == metav1.ConditionFalse && c.Reason == "Resized"
		tpl := e.templateSize(sts)
		return ok && resized && allSized(sizes, claims, size) && tpl == size && revisionOf(u) == before+1,
			fmt.Sprintf("%s; claims %v; template %s; StorageResizing %v; revision %d (before %d)", obs, sizes, tpl, c, revisionOf(u), before)
	})
	e.waitFor("the StatefulSet ready with the same pods", 2*time.Minute, func() (bool, string) {
		s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(context.Background(), sts, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return int(s.Status.ReadyReplicas) == claims, fmt.Sprintf("readyReplicas=%d", s.Status.ReadyReplicas)
	})
	after := e.podUIDs(name)
	for pod, uid := range pods {
		if after[pod] != uid {
			e.t.Errorf("pod %s was replaced while its volume grew (uid %s → %s)", pod, uid, after[pod])
		}
	}
	e.waitEvent(name, "StorageGrowing", "expanding PersistentVolumeClaim")
	e.waitEvent(name, "StorageResized", claimPrefix)
}

// TestStorageGrowsInPlace: a Postgres on 1Gi grown to 2Gi, and a Redis (a
// passthrough kind) the same way: every claim and the StatefulSet's
// template follow, with the same pods and one new revision.
func TestStorageGrowsInPlace(t *testing.T) {
	e := setup(t)
	e.apply(postgresGVR, "Postgres", "grow", map[string]any{
		"version": "17", "replicas": 2,
		"storage": map[string]any{"size": "1Gi"},
	})
	e.apply(redisGVR, "Redis", "cache", map[string]any{
		"persistence": map[string]any{"enabled": true, "size": "1Gi"},
	})
	for _, r := range []struct {
		gvr  schema.GroupVersionResource
		name string
		n    int
	}{{postgresGVR, "grow", 2}, {redisGVR, "cache", 1}} {
		e.waitFor(r.name+" Ready with its pods ready", 3*time.Minute, func() (bool, string) {
			ok, obs := ready(e.get(r.gvr, r.name))
			s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(context.Background(), r.name, metav1.GetOptions{})
			if err != nil {
				return false, obs + "; " + err.Error()
			}
			return ok && int(s.Status.ReadyReplicas) == r.n, fmt.Sprintf("%s readyReplicas=%d", obs, s.Status.ReadyReplicas)
		})
	}
	e.growInPlace(postgresGVR, "grow", "grow", "data-grow-", 2, `{"spec":{"storage":{"size":"2Gi"}}}`, "2Gi")
	e.growInPlace(redisGVR, "cache", "cache", "data-cache-", 1, `{"spec":{"persistence":{"size":"2Gi"}}}`, "2Gi")
}

// TestStorageChangesRefused: a shrink, a move to another StorageClass and
// growth on a class that cannot expand are refused before anything
// changes: at admission for Postgres, as Stalled for the passthrough Redis,
// with nothing rolled back and no revision added.
func TestStorageChangesRefused(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	fixed := "fixed-" + e.ns
	noExpand := false
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: fixed}, Provisioner: testcluster.ProvisionerName, AllowVolumeExpansion: &noExpand}
	if _, err := e.cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.StorageV1().StorageClasses().Delete(context.Background(), fixed, metav1.DeleteOptions{})
	})

	// Postgres: refused at admission, naming the field and the fix.
	e.apply(postgresGVR, "Postgres", "pinned", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi", "storageClass": fixed},
	})
	e.apply(postgresGVR, "Postgres", "plain", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi"},
	})
	err := e.patch(postgresGVR, "pinned", `{"spec":{"storage":{"size":"2Gi"}}}`)
	if err == nil || !strings.Contains(err.Error(), "spec.storage.size") || !strings.Contains(err.Error(), fixed) || !strings.Contains(err.Error(), "allowVolumeExpansion: true") {
		t.Errorf("growth on a class without expansion: want a refusal naming spec.storage.size, the class and the fix, got %v", err)
	}
	err = e.patch(postgresGVR, "plain", fmt.Sprintf(`{"spec":{"storage":{"storageClass":%q}}}`, fixed))
	if err == nil || !strings.Contains(err.Error(), "spec.storage.storageClass") || !strings.Contains(err.Error(), testcluster.DefaultStorageClass) {
		t.Errorf("a move from the default class: want a refusal naming spec.storage.storageClass and the class to keep, got %v", err)
	}
	// Naming the default class the volumes already have is no move: the
	// StatefulSet is re-created with the class named, the pods kept.
	e.waitFor("plain Ready", 3*time.Minute, func() (bool, string) { return ready(e.get(postgresGVR, "plain")) })
	before, pods := revisionOf(e.get(postgresGVR, "plain")), e.podUIDs("plain")
	if err := e.patch(postgresGVR, "plain", fmt.Sprintf(`{"spec":{"storage":{"storageClass":%q}}}`, testcluster.DefaultStorageClass)); err != nil {
		t.Errorf("naming the default class it already has: %v", err)
	}
	e.waitFor("plain Ready on a new revision", 3*time.Minute, func() (bool, string) {
		u := e.get(postgresGVR, "plain")
		ok, obs := ready(u)
		return ok && revisionOf(u) == before+1, fmt.Sprintf("%s revision %d", obs, revisionOf(u))
	})
	if after := e.podUIDs("plain"); fmt.Sprint(after) != fmt.Sprint(pods) {
		t.Errorf("pods %v after naming the class, %v before", after, pods)
	}

	// Redis (passthrough): Stalled before anything changes.
	e.apply(redisGVR, "Redis", "small", map[string]any{
		"persistence": map[string]any{"enabled": true, "size": "2Gi"},
	})
	e.apply(redisGVR, "Redis", "kept", map[string]any{
		"persistence": map[string]any{"enabled": true, "size": "1Gi", "storageClass": fixed},
	})
	for _, name := range []string{"small", "kept"} {
		e.waitFor(name+" Ready", 3*time.Minute, func() (bool, string) { return ready(e.get(redisGVR, name)) })
	}
	refused := func(name, patch, reason string, says ...string) {
		t.Helper()
		before := revisionOf(e.get(redisGVR, name))
		tpl := e.templateSize(name)
		claims := e.claimSizes("data-" + name + "-")
		if err := e.patch(redisGVR, name, patch); err != nil {
			t.Fatal(err)
		}
		u := e.waitCondition(redisGVR, name, v1alpha1.ConditionStalled, metav1.ConditionTrue, reason)
		msg := condition(u, v1alpha1.ConditionStalled).Message
		for _, s := range append(says, "nothing was changed") {
			if !strings.Contains(msg, s) {
				t.Errorf("%s: Stalled message %q does not say %q", name, msg, s)
			}
		}
		if ok, _ := ready(u); ok {
			t.Errorf("%s Ready while its input is refused", name)
		}
		// A wrong action is given room to show.
		if ok, seen := e.holds(2*time.Second, func() (bool, string) {
			if r := revisionOf(e.get(redisGVR, name)); r != before {
				return false, fmt.Sprintf("revision %d after a refused change, %d before", r, before)
			}
			if got := e.templateSize(name); got != tpl {
				return false, fmt.Sprintf("template %s after a refused change, %s before", got, tpl)
			}
			if got := e.claimSizes("data-" + name + "-"); fmt.Sprint(got) != fmt.Sprint(claims) {
				return false, fmt.Sprintf("claims %v after a refused change, %v before", got, claims)
			}
			if _, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false, fmt.Sprintf("StatefulSet after a refused change: %v", err)
			}
			return true, ""
		}); !ok {
			t.Errorf("%s: %s", name, seen)
		}
	}
	refused("small", `{"spec":{"persistence":{"size":"1Gi"}}}`, "StorageShrink", "volumeClaimTemplates[data]", "2Gi → 1Gi", "at least 2Gi")
	refused("kept", fmt.Sprintf(`{"spec":{"persistence":{"storageClass":%q}}}`, testcluster.DefaultStorageClass), "StorageClassChange", "storageClassName", fixed)
	refused("kept", `{"spec":{"persistence":{"storageClass":"`+fixed+`","size":"2Gi"}}}`, "StorageNotExpandable", fixed, "allowVolumeExpansion: true")

	// Setting the input back lifts the stall with no new revision.
	before = revisionOf(e.get(redisGVR, "small"))
	if err := e.patch(redisGVR, "small", `{"spec":{"persistence":{"size":"2Gi"}}}`); err != nil {
		t.Fatal(err)
	}
	e.waitFor("small Ready again", 2*time.Minute, func() (bool, string) { return ready(e.get(redisGVR, "small")) })
	if r := revisionOf(e.get(redisGVR, "small")); r != before {
		t.Errorf("revision %d after the size was set back, %d before", r, before)
	}
}
