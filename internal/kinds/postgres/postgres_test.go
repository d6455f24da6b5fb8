package postgres

import (
	"context"
	"reflect"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func pgObject(spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "chartpilot.dev/v1alpha1", "kind": "Postgres",
		"metadata": map[string]any{"name": "db", "namespace": "ns"},
		"spec":     spec,
	}}
}

func TestValuesTranslation(t *testing.T) {
	got, err := Values(pgObject(map[string]any{
		"version":  "16.4",
		"replicas": int64(3),
		"storage":  map[string]any{"size": "20Gi", "storageClass": "fast"},
		"resources": map[string]any{
			"limits": map[string]any{"memory": "1Gi", "cpu": "2"},
		},
		"parameters":        map[string]any{"max_connections": "50"},
		"nodeSelector":      map[string]any{"disk": "ssd"},
		"tolerations":       []any{map[string]any{"key": "db", "operator": "Exists"}},
		"priorityClassName": "critical",
		"metrics":           true,
		// The escape hatch is the lowest layer: typed fields win over it.
		"values": map[string]any{"replicas": int64(1), "podAntiAffinity": "hard", "image": map[string]any{"repository": "mirror/postgres"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"image":    map[string]any{"repository": "mirror/postgres", "tag": "16.4"},
		"replicas": int64(3),
		"failover": map[string]any{"enabled": true}, // more than one replica: on by default
		"storage":  map[string]any{"size": "20Gi", "storageClass": "fast"},
		"metrics":  map[string]any{"enabled": true},
		"parameters": map[string]any{
			"max_connections": "50", "shared_buffers": "256MB", "effective_cache_size": "768MB",
			"maintenance_work_mem": "64MB", "work_mem": "5242kB", "max_worker_processes": "8",
		},
		"resources":         map[string]any{"limits": map[string]any{"memory": "1Gi", "cpu": "2"}},
		"nodeSelector":      map[string]any{"disk": "ssd"},
		"tolerations":       []any{map[string]any{"key": "db", "operator": "Exists"}},
		"priorityClassName": "critical",
		"podAntiAffinity":   "hard",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Values =\n%v\nwant\n%v", got, want)
	}
}

func TestStatusReportsReadyReplicasUntilAllReady(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"}, Status: appsv1.StatefulSetStatus{ReadyReplicas: 1}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sts).Build()
	obj := pgObject(map[string]any{"version": "17", "replicas": int64(2), "storage": map[string]any{"size": "1Gi"}})
	extras, again, err := Status(context.Background(), c, obj)
	if err != nil {
		t.Fatal(err)
	}
	if extras["readyReplicas"] != int64(1) || extras["version"] != "17" || again != 5*time.Second {
		t.Errorf("1 of 2 ready: extras %v, again %s", extras, again)
	}
	if ep := extras["endpoints"].(map[string]any); ep["readWrite"] != "db" || ep["readOnly"] != "db-ro" || ep["secret"] != "db-auth" || ep["port"] != nil {
		t.Errorf("endpoints before the Service exists = %v", ep)
	}
	if extras["tuning"] != nil {
		t.Errorf("tuning without memory: %v", extras["tuning"])
	}
	sts.Status.ReadyReplicas = 2
	c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(sts).Build()
	// Failover (on with two replicas): the primary is read again every
	// FailoverCheckPeriod; before any member has started there is none.
	if extras, again, _ := Status(context.Background(), c, obj); again != FailoverCheckPeriod || extras["primary"] != nil {
		t.Errorf("all ready with failover: again in %s, primary %v", again, extras["primary"])
	}
	noFailover := pgObject(map[string]any{"version": "17", "replicas": int64(2), "storage": map[string]any{"size": "1Gi"}, "failover": map[string]any{"enabled": false}})
	if extras, again, _ := Status(context.Background(), c, noFailover); again != 0 || extras["primary"] != "db-0" {
		t.Errorf("all ready without failover: again in %s, primary %v (want db-0)", again, extras["primary"])
	}
}

// The endpoints' port is the read-write Service's postgresql port (the
// chart's service.port), which clients and the backup Jobs connect to.
func TestStatusReportsServicePort(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
		{Name: "metrics", Port: 9187}, {Name: "postgresql", Port: 6432},
	}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(svc).Build()
	extras, _, err := Status(context.Background(), c, pgObject(map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}}))
	if err != nil {
		t.Fatal(err)
	}
	if ep := extras["endpoints"].(map[string]any); ep["port"] != int64(6432) {
		t.Errorf("endpoints = %v, want port 6432", ep)
	}
}

// The CA Secret is the one the StatefulSet mounts as "tls" (the chart's
// own or tls.existingSecret); none when the server takes no TLS.
func TestStatusReportsCASecret(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	obj := pgObject(map[string]any{"version": "17", "storage": map[string]any{"size": "1Gi"}, "failover": map[string]any{"enabled": false}})
	for _, tc := range []struct {
		volumes []corev1.Volume
		want    any
	}{
		{[]corev1.Volume{{Name: "config"}, {Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "issued-by-cert-manager"}}}}, "issued-by-cert-manager"},
		{[]corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db-config"}}}}, nil},
	} {
		sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"}}
		sts.Spec.Template.Spec.Volumes = tc.volumes
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sts).Build()
		extras, _, err := Status(context.Background(), c, obj)
		if err != nil {
			t.Fatal(err)
		}
		if ep := extras["endpoints"].(map[string]any); ep["caSecret"] != tc.want {
			t.Errorf("volumes %v: endpoints = %v, want caSecret %v", tc.volumes, ep, tc.want)
		}
	}
}

// TestStatusReportsFailover: the primary is the holder of the cluster's
// Lease, and a Lease the promoting member annotated gives lastFailover.
func TestStatusReportsFailover(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	at := metav1.NewMicroTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "db-primary", Namespace: "ns", Annotations: map[string]string{"chartpilot.dev/previous": "db-0", "chartpilot.dev/lag-bytes": "128"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: new("db-1"), AcquireTime: &at},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lease).Build()
	obj := pgObject(map[string]any{"version": "17", "replicas": int64(3), "storage": map[string]any{"size": "1Gi"}})
	extras, _, err := Status(context.Background(), c, obj)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := extras["lastFailover"].(map[string]any)
	if extras["primary"] != "db-1" || last["from"] != "db-0" || last["to"] != "db-1" || last["lagBytes"] != int64(128) || last["at"] != "2026-11-30T12:00:00Z" {
		t.Errorf("primary %v, lastFailover %v", extras["primary"], last)
	}
}

func TestMajorVersions(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"spec":   map[string]any{"version": "17.2"},
		"status": map[string]any{"version": "16"},
	}}
	if got := Major(obj); got != "17" {
		t.Errorf("Major = %q, want 17", got)
	}
	if got := DeployedMajor(obj); got != "16" {
		t.Errorf("DeployedMajor = %q, want 16", got)
	}
	if got := DeployedMajor(&unstructured.Unstructured{Object: map[string]any{}}); got != "" {
		t.Errorf("DeployedMajor without status = %q, want empty", got)
	}
}

// TestFactsFromRenderedValues: tenant limits see what the chart renders,
// spec.values included, not only the typed fields.
func TestFactsFromRenderedValues(t *testing.T) {
	for _, tc := range []struct {
		name              string
		spec              map[string]any
		cpuMilli, memory  int64
		replicas, storage int64
	}{
		{"typed fields", map[string]any{"version": "16", "replicas": int64(2), "storage": map[string]any{"size": "1Gi"},
			"resources": map[string]any{"limits": map[string]any{"cpu": "2", "memory": "1Gi"}}}, 2000, 1 << 30, 2, 1 << 30},
		{"resources through spec.values", map[string]any{"version": "16", "storage": map[string]any{"size": "1Gi"},
			"values": map[string]any{"resources": map[string]any{"limits": map[string]any{"cpu": "8", "memory": "64Gi"}}}}, 8000, 64 << 30, 1, 1 << 30},
		{"typed replicas win over spec.values", map[string]any{"version": "16", "replicas": int64(1), "storage": map[string]any{"size": "1Gi"},
			"values": map[string]any{"replicas": int64(9)}}, 0, 0, 1, 1 << 30},
	} {
		obj := pgObject(tc.spec)
		vals, err := Values(obj)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		f := Facts(obj, vals)
		if f.CPUMilli != tc.cpuMilli || f.MemoryBytes != tc.memory || f.Replicas != tc.replicas || f.StorageBytes != tc.storage || f.Version != "16" {
			t.Errorf("%s: facts %+v", tc.name, f)
		}
	}
}
