package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/operator"
)

var (
	backupStoreGVR = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "backupstores"}
	backupGVR      = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "backups"}
)

// volumeStore makes a BackupStore on a claim of its own ("backups").
func (e *env) volumeStore(name string) {
	e.t.Helper()
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "backups"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.apply(backupStoreGVR, "BackupStore", name, map[string]any{"volume": map[string]any{"claimName": "backups"}})
}

// endJobPod plays the kubelet at the end of a Job's pod (no node takes it
// while the nodes are cordoned): Succeeded with the container's
// termination message.
func (e *env) endJobPod(job, message string) {
	e.t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	e.waitFor("a pod of Job "+job, 3*time.Minute, func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprint(err)
		}
		pod = &pods.Items[0]
		return true, ""
	})
	now := metav1.Now()
	ctr := pod.Spec.Containers[0]
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ctr.Name, Image: ctr.Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: message, StartedAt: now, FinishedAt: now}}}}
	if _, err := e.cs.CoreV1().Pods(e.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("ending pod %s: %v", pod.Name, err)
	}
}

// TestPostgresMajorUpgradeCarriedOut: with the opt-in, a 16 → 17 change of
// a Postgres takes a fresh backup, then a Job moves the data to a new
// claim, and only then does the release switch: the StatefulSet is
// re-created on the new claim template (its pods replaced), the old claim
// stays, and the status names both volumes. The local cluster's pods are
// simulated, so the test plays the kubelet of the two Jobs' pods and
// reports for them what their commands report (the commands themselves
// run against real PostgreSQL servers in internal/controller/backup's tests).
func TestPostgresMajorUpgradeCarriedOut(t *testing.T) {
	e := setup(t, func(o *operator.Options) { o.BackupImage = "chartpilot:test" })
	ctx := context.Background()
	e.volumeStore("vol")
	e.apply(postgresGVR, "Postgres", "pg", map[string]any{"version": "16", "storage": map[string]any{"size": "1Gi"},
		"backup": map[string]any{"store": map[string]any{"name": "vol"}, "schedule": "0 3 * * *"}})
	sts := func() (image string, templates []string) {
		s, err := e.cs.AppsV1().StatefulSets(e.ns).Get(ctx, "pg", metav1.GetOptions{})
		if err != nil {
			return err.Error(), nil
		}
		for _, tpl := range s.Spec.VolumeClaimTemplates {
			templates = append(templates, tpl.Name)
		}
		return s.Spec.Template.Spec.Containers[0].Image, templates
	}
	e.waitFor("Postgres pg Ready on 16", 3*time.Minute, func() (bool, string) {
		ok, obs := ready(e.get(postgresGVR, "pg"))
		img, _ := sts()
		return ok && strings.HasSuffix(img, ":16"), obs + " image " + img
	})
	if _, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data-pg-0", metav1.GetOptions{}); err != nil {
		t.Fatalf("the data claim of 16: %v", err)
	}

	if err := cluster.Cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Cordon(context.Background(), false) })
	if err := e.patch(postgresGVR, "pg", `{"metadata":{"annotations":{"chartpilot.dev/allow-major-upgrade":"17"}},"spec":{"version":"17"}}`); err != nil {
		t.Fatal(err)
	}
	// The fresh backup first.
	var backupJob string
	e.waitFor("the Backup before the major upgrade running", 3*time.Minute, func() (bool, string) {
		u, err := e.dyn.Resource(backupGVR).Namespace(e.ns).Get(ctx, "pg-before-major-17", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		backupJob, _, _ = unstructured.NestedString(u.Object, "status", "job")
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "message")
		return backupJob != "", "phase " + phase + ": " + msg
	})
	if img, _ := sts(); !strings.HasSuffix(img, ":16") {
		t.Fatalf("the image changed to %s before the backup", img)
	}
	manifest, _ := json.Marshal(backup.Manifest{Format: backup.Format, Created: time.Now(), Size: 4096, SHA256: strings.Repeat("ab", 32), PlainSize: 16384, Compression: "zstd"})
	e.endJobPod(backupJob, string(manifest))

	// Then the Job that moves the data; the release waits for it.
	var job *batchv1.Job
	e.waitFor("the major upgrade Job", 3*time.Minute, func() (bool, string) {
		j, err := e.cs.BatchV1().Jobs(e.ns).Get(ctx, "pg-major-17", metav1.GetOptions{})
		if err != nil {
			c := condition(e.get(postgresGVR, "pg"), "BackupBeforeMajorUpgrade")
			return false, fmt.Sprintf("%v; %+v", err, c)
		}
		job = j
		return true, ""
	})
	if img := job.Spec.Template.Spec.Containers[0].Image; img != "postgres:17" {
		t.Errorf("the major upgrade Job runs %s, want postgres:17", img)
	}
	e.waitFor("MajorUpgradeRunning while the data moves", time.Minute, func() (bool, string) {
		c := condition(e.get(postgresGVR, "pg"), "BackupBeforeMajorUpgrade")
		return c != nil && c.Reason == "MajorUpgradeRunning", fmt.Sprintf("%+v", c)
	})
	if img, tpl := sts(); !strings.HasSuffix(img, ":16") || strings.Join(tpl, ",") != "data" {
		t.Fatalf("the release changed (%s, %v) before the data moved", img, tpl)
	}
	report, _ := json.Marshal(majorupgrade.Report{OK: true, Major: "17", Databases: 2, Tables: 3, Rows: 1200, Seconds: 4.2})
	e.endJobPod("pg-major-17", string(report))
	if err := cluster.Cordon(ctx, false); err != nil {
		t.Fatal(err)
	}

	e.waitFor("Postgres pg Ready on 17 on the new claim template", 4*time.Minute, func() (bool, string) {
		ok, obs := ready(e.get(postgresGVR, "pg"))
		img, tpl := sts()
		return ok && strings.HasSuffix(img, ":17") && strings.Join(tpl, ",") == "data-pg17", fmt.Sprintf("%s image %s templates %v", obs, img, tpl)
	})
	pod, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, "pg-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mounted := ""
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			mounted = v.PersistentVolumeClaim.ClaimName
		}
	}
	if mounted != "data-pg17-pg-0" {
		t.Errorf("pod pg-0 mounts claim %q, want data-pg17-pg-0 (where the Job put the data)", mounted)
	}
	if _, err := e.cs.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data-pg-0", metav1.GetOptions{}); err != nil {
		t.Errorf("the old claim was not kept: %v", err)
	}
	st := &v1alpha1.PostgresStatus{}
	_ = runtime.DefaultUnstructuredConverter.FromUnstructured(e.get(postgresGVR, "pg").Object["status"].(map[string]any), st)
	if st.DataVolume == nil || st.DataVolume.Name != "data-pg17" || st.DataVolume.Major != "17" {
		t.Errorf("status.dataVolume %+v", st.DataVolume)
	}
	if pv := st.PreviousVolume; pv == nil || pv.Name != "data" || pv.Major != "16" || strings.Join(pv.Claims, ",") != "data-pg-0" {
		t.Errorf("status.previousVolume %+v, want the claim data-pg-0 of 16", pv)
	}
	if mu := st.MajorUpgrade; mu == nil || mu.Phase != "Completed" || mu.Rows != 1200 {
		t.Errorf("status.majorUpgrade %+v", mu)
	}
	e.waitFor("events of the move and of the replaced StatefulSet", 2*time.Minute, func() (bool, string) {
		evs, err := e.cs.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=pg"})
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]bool{}
		for _, ev := range evs.Items {
			seen[ev.Reason] = true
		}
		return seen["MajorUpgradeDataMoved"] && seen["VolumesReplaced"], fmt.Sprint(seen)
	})
}
