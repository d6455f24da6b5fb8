package jobspec

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// flagValue is the value after flag in args ("" when absent).
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// A status from before the port was reported: the chart's default.
func TestPostgresPortDefault(t *testing.T) {
	pg := &v1alpha1.Postgres{}
	pg.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "orders-rw", Secret: "orders-auth"}
	for _, e := range pgEnv(pg) {
		if e.Name == "PGPORT" && e.Value != "5432" {
			t.Errorf("PGPORT = %q, want 5432", e.Value)
		}
	}
}

// A restore stages at most the recorded size plus headroom in /tmp; a
// volume store is mounted and written below its path.
func TestAgentJobVolumes(t *testing.T) {
	job := agentJob("shop", "restore-x", nil, "img", time.Hour, []string{"restore", "--expect-sha256", "abc", "--expect-size", "1000"}, nil, nil, nil)
	var tmp *corev1.Volume
	for i := range job.Spec.Template.Spec.Volumes {
		if v := &job.Spec.Template.Spec.Volumes[i]; v.Name == "tmp" {
			tmp = v
		}
	}
	if tmp == nil || tmp.EmptyDir == nil || tmp.EmptyDir.SizeLimit == nil || tmp.EmptyDir.SizeLimit.Cmp(*resource.NewQuantity(1000+tmpHeadroom, resource.BinarySI)) != 0 {
		t.Errorf("/tmp of a restore of 1000 bytes: %+v", tmp)
	}
	store, env, volumes, mounts := StoreFlags(v1alpha1.BackupStoreSpec{Volume: &v1alpha1.VolumeStore{ClaimName: "backups", Path: "team-a"}})
	args := store.Args()
	if flagValue(args, "--store") != "volume" || flagValue(args, "--volume-path") != "/backups/team-a" || len(env) != 0 {
		t.Errorf("volume store: args %q, env %v", args, env)
	}
	if len(volumes) != 1 || volumes[0].PersistentVolumeClaim == nil || volumes[0].PersistentVolumeClaim.ClaimName != "backups" || len(mounts) != 1 || mounts[0].MountPath != "/backups" {
		t.Errorf("volume store: volumes %+v, mounts %+v", volumes, mounts)
	}
}

// TestPassthroughJobsPlacedAsPods: a passthrough kind's backup and restore
// Jobs take the node selector and tolerations of the release's pods from
// the values paths its backup block names; values of another shape are
// left out, and a block naming none places the Jobs anywhere.
func TestPassthroughJobsPlacedAsPods(t *testing.T) {
	block := &watches.Backup{Image: "redis:7.4", Command: []string{"redis-cli"}, NodeSelectorValue: "nodeSelector", TolerationsValue: "placement.tolerations"}
	values := map[string]any{
		"nodeSelector": map[string]any{"pool": "cache", "bad": int64(3)},
		"placement": map[string]any{"tolerations": []any{
			map[string]any{"key": "cache", "operator": "Exists", "effect": "NoSchedule"},
			"not a toleration",
			map[string]any{"key": "x", "tolerationSeconds": "soon"},
		}},
	}
	at := func(p []string) (any, bool) {
		v, ok, _ := unstructured.NestedFieldNoCopy(values, p...)
		return v, ok
	}
	job := placedByValues(agentJob("shop", "j", nil, "redis:7.4", time.Minute, nil, nil, nil, nil), block, at)
	pod := job.Spec.Template.Spec
	if len(pod.NodeSelector) != 1 || pod.NodeSelector["pool"] != "cache" {
		t.Errorf("node selector %v, want pool=cache only", pod.NodeSelector)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "cache" || pod.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("tolerations %+v, want the one of key cache", pod.Tolerations)
	}
	none := placedByValues(agentJob("shop", "j", nil, "redis:7.4", time.Minute, nil, nil, nil, nil), &watches.Backup{Image: "redis:7.4", Command: []string{"redis-cli"}}, at)
	if p := none.Spec.Template.Spec; p.NodeSelector != nil || p.Tolerations != nil {
		t.Errorf("a block naming no values placed the Job: %v %v", p.NodeSelector, p.Tolerations)
	}
}

// No Job connects to a server that takes TLS until the CA to verify it is
// known; a server whose StatefulSet mounts no certificate needs none.
// What spec.values says does not count (later layers may override it).
func TestServerUnverified(t *testing.T) {
	off, on := false, true
	for _, tc := range []struct {
		name  string
		ep    *v1alpha1.PostgresEndpoints
		waits bool
	}{
		{"no status yet", nil, true},
		{"the StatefulSet not seen yet", &v1alpha1.PostgresEndpoints{ReadWrite: "db"}, true},
		{"the CA reported", &v1alpha1.PostgresEndpoints{CASecret: "db-tls", TLS: &on}, false},
		{"TLS seen without a CA", &v1alpha1.PostgresEndpoints{TLS: &on}, true},
		{"no TLS seen", &v1alpha1.PostgresEndpoints{TLS: &off}, false},
	} {
		pg := &v1alpha1.Postgres{}
		pg.Name = "db"
		pg.Spec.Values = &apiextensionsv1.JSON{Raw: []byte(`{"tls":{"enabled":false},"TLS":{"enabled":false}}`)}
		pg.Status.Endpoints = tc.ep
		why := ServerUnverified(pg)
		if (why != "") != tc.waits {
			t.Errorf("%s: %q, want waiting %v", tc.name, why, tc.waits)
		}
		if why != "" && !strings.Contains(why, "status.endpoints.caSecret") {
			t.Errorf("%s: %q names no field", tc.name, why)
		}
	}
}
