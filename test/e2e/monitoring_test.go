package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

var (
	serviceMonitorGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}
	promRuleGVR       = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"}
)

// TestMonitoringWhenPrometheusOperatorArrives: a Postgres with
// spec.monitoring.enabled on a cluster without the Prometheus Operator's
// CRDs is Ready, with its exporter and MonitoringReady=False
// PrometheusOperatorNotInstalled; once the CRDs (generated from the
// Prometheus Operator's API module) are installed, the same operator,
// not restarted, adds a ServiceMonitor and a PrometheusRule with the
// resource's labels to the release, and MonitoringReady turns True. A
// Redis (passthrough) annotated chartpilot.dev/monitoring gets the same
// from watches.yaml's monitoring block.
func TestMonitoringWhenPrometheusOperatorArrives(t *testing.T) {
	crdOpts := envtest.CRDInstallOptions{Paths: []string{filepath.Join("testdata", "monitoring.coreos.com_servicemonitors.yaml"), filepath.Join("testdata", "monitoring.coreos.com_prometheusrules.yaml")}}
	e := setup(t)
	if _, err := e.dyn.Resource(serviceMonitorGVR).List(context.Background(), metav1.ListOptions{Limit: 1}); err == nil {
		t.Fatal("the ServiceMonitor CRD is installed before the test: it must start without it")
	}
	e.apply(postgresGVR, "Postgres", "mon", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi"},
		"monitoring": map[string]any{"enabled": true, "labels": map[string]any{"prometheus": "team-a"}},
	})
	// A passthrough kind asks by annotation (watches.yaml's monitoring block).
	if _, err := e.dyn.Resource(redisGVR).Namespace(e.ns).Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Redis",
		"metadata": map[string]any{"name": "cache", "namespace": e.ns, "annotations": map[string]any{"chartpilot.dev/monitoring": "true"}},
		"spec":     map[string]any{},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("mon Ready", 3*time.Minute, func() (bool, string) { return ready(e.get(postgresGVR, "mon")) })
	e.waitCondition(redisGVR, "cache", v1alpha1.ConditionMonitoringReady, metav1.ConditionFalse, "PrometheusOperatorNotInstalled")
	dep, err := e.cs.AppsV1().Deployments(e.ns).Get(context.Background(), "cache", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(dep.Spec.Template.Spec.Containers); n != 2 {
		t.Errorf("the Redis Deployment has %d containers: the annotation should add the exporter", n)
	}
	u := e.waitCondition(postgresGVR, "mon", v1alpha1.ConditionMonitoringReady, metav1.ConditionFalse, "PrometheusOperatorNotInstalled")
	if msg := condition(u, v1alpha1.ConditionMonitoringReady).Message; !strings.Contains(msg, "install the Prometheus Operator's CRDs") {
		t.Errorf("MonitoringReady message %q does not say what to do", msg)
	}
	sts, err := e.cs.AppsV1().StatefulSets(e.ns).Get(context.Background(), "mon", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(sts.Spec.Template.Spec.Containers); n != 2 {
		t.Errorf("the StatefulSet has %d containers: the exporter should run beside PostgreSQL", n)
	}

	if _, err := envtest.InstallCRDs(cluster.Config, crdOpts); err != nil {
		t.Fatalf("installing the Prometheus Operator's CRDs: %v", err)
	}
	t.Cleanup(func() { _ = envtest.UninstallCRDs(cluster.Config, crdOpts) })

	e.waitCondition(postgresGVR, "mon", v1alpha1.ConditionMonitoringReady, metav1.ConditionTrue, "Monitored")
	for _, gvr := range []schema.GroupVersionResource{serviceMonitorGVR, promRuleGVR} {
		e.waitFor(gvr.Resource+" mon", 2*time.Minute, func() (bool, string) {
			o, err := e.dyn.Resource(gvr).Namespace(e.ns).Get(context.Background(), "mon", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, "not found"
			}
			if err != nil {
				return false, err.Error()
			}
			l := o.GetLabels()
			return l["prometheus"] == "team-a" && l["app.kubernetes.io/instance"] == "mon", fmt.Sprintf("labels %v", l)
		})
	}
	e.waitCondition(redisGVR, "cache", v1alpha1.ConditionMonitoringReady, metav1.ConditionTrue, "Monitored")
	e.waitFor("servicemonitor cache", 2*time.Minute, func() (bool, string) {
		_, err := e.dyn.Resource(serviceMonitorGVR).Namespace(e.ns).Get(context.Background(), "cache", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	e.waitFor("mon Ready after the upgrade", 3*time.Minute, func() (bool, string) { return ready(e.get(postgresGVR, "mon")) })
	if rev, _, _ := unstructured.NestedInt64(e.get(postgresGVR, "mon").Object, "status", "release", "revision"); rev != 2 {
		t.Errorf("release revision %d: adding monitoring should be one upgrade", rev)
	}
}

// TestRestoreKeepsNotReady: a Postgres whose spec.restore cannot be
// carried out (the Backup it names does not exist) is installed, but not
// Ready: Restored=False names the missing Backup, and Ready says the same.
// Nothing is retried and nothing is deleted.
func TestRestoreKeepsNotReady(t *testing.T) {
	e := setup(t)
	e.apply(postgresGVR, "Postgres", "copy", map[string]any{
		"version": "17", "storage": map[string]any{"size": "1Gi"},
		"restore": map[string]any{"fromBackup": "nightly-missing"},
	})
	e.waitCondition(postgresGVR, "copy", v1alpha1.ConditionReleased, metav1.ConditionTrue, "")
	u := e.waitCondition(postgresGVR, "copy", v1alpha1.ConditionRestored, metav1.ConditionFalse, "RestoreFailed")
	if msg := condition(u, v1alpha1.ConditionRestored).Message; !strings.Contains(msg, "spec.restore.fromBackup: Backup nightly-missing does not exist") {
		t.Errorf("Restored message %q does not name the field and the Backup", msg)
	}
	e.waitFor("Ready=False naming the restore", 2*time.Minute, func() (bool, string) {
		c := condition(e.get(postgresGVR, "copy"), v1alpha1.ConditionReady)
		if c == nil {
			return false, "no Ready"
		}
		return c.Status == metav1.ConditionFalse && c.Reason == "RestoreFailed", fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
	})
	if _, err := e.cs.AppsV1().StatefulSets(e.ns).Get(context.Background(), "copy", metav1.GetOptions{}); err != nil {
		t.Errorf("the release's StatefulSet: %v (a failed restore must leave the release installed)", err)
	}
}
