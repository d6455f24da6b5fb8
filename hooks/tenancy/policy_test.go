package tenancy

import (
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
)

func q(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
func i64(n int64) *int64            { return &n }

func tenant(l v1alpha1.TenantLimits) *v1alpha1.Tenant {
	return &v1alpha1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "acme"}, Spec: v1alpha1.TenantSpec{Limits: l}}
}

func object(f hooks.Facts, chartVersion string) hooks.Object {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("chartpilot.dev/v1alpha1")
	u.SetKind("Postgres")
	u.SetName("db")
	u.SetNamespace("team-a")
	return hooks.Object{Resource: u, Facts: f, ChartName: "postgresql", ChartVersion: chartVersion}
}

func TestChecks(t *testing.T) {
	gi := int64(1 << 30)
	for _, tc := range []struct {
		name   string
		limits v1alpha1.TenantLimits
		facts  hooks.Facts
		chart  string
		reason string
		msg    []string
	}{
		{"no limits", v1alpha1.TenantLimits{}, hooks.Facts{Replicas: 9}, "0.1.0", "", nil},
		{"replicas at the limit", v1alpha1.TenantLimits{MaxReplicas: i64(3)}, hooks.Facts{Replicas: 3}, "0.1.0", "", nil},
		{"replicas over", v1alpha1.TenantLimits{MaxReplicas: i64(3)}, hooks.Facts{Replicas: 5}, "0.1.0", "MaxReplicasExceeded", []string{"replicas 5", "maxReplicas 3", "acme"}},
		{"class allowed", v1alpha1.TenantLimits{AllowedStorageClasses: []string{"fast"}}, hooks.Facts{StorageBytes: gi, StorageClass: "fast"}, "", "", nil},
		{"class refused", v1alpha1.TenantLimits{AllowedStorageClasses: []string{"fast"}}, hooks.Facts{StorageBytes: gi, StorageClass: "slow"}, "", "StorageClassNotAllowed", []string{"slow", "allowedStorageClasses [fast]"}},
		{"default class counts", v1alpha1.TenantLimits{AllowedStorageClasses: []string{"fast"}, DefaultStorageClass: "fast"}, hooks.Facts{StorageBytes: gi}, "", "", nil},
		{"cluster default not allowed", v1alpha1.TenantLimits{AllowedStorageClasses: []string{"fast"}}, hooks.Facts{StorageBytes: gi}, "", "StorageClassNotAllowed", []string{"cluster default"}},
		{"no volume, no class check", v1alpha1.TenantLimits{AllowedStorageClasses: []string{"fast"}}, hooks.Facts{StorageClass: "slow"}, "", "", nil},
		{"storage over", v1alpha1.TenantLimits{MaxStorage: q("10Gi")}, hooks.Facts{StorageBytes: 4 * gi, Replicas: 3}, "", "MaxStorageExceeded", []string{"12Gi", "3 replicas x 4Gi", "maxStorage 10Gi"}},
		{"storage within", v1alpha1.TenantLimits{MaxStorage: q("12Gi")}, hooks.Facts{StorageBytes: 4 * gi, Replicas: 3}, "", "", nil},
		{"chart version refused", v1alpha1.TenantLimits{AllowedVersions: "<0.1.0"}, hooks.Facts{}, "0.1.0", "VersionNotAllowed", []string{"chart version 0.1.0", "<0.1.0"}},
		{"postgres version refused", v1alpha1.TenantLimits{AllowedVersions: ">=16, <17"}, hooks.Facts{Version: "17"}, "0.1.0", "VersionNotAllowed", []string{"version 17", ">=16, <17"}},
		{"postgres version allowed", v1alpha1.TenantLimits{AllowedVersions: ">=0.1.0"}, hooks.Facts{Version: "16.4"}, "0.1.0", "", nil},
		{"bad constraint", v1alpha1.TenantLimits{AllowedVersions: "~~"}, hooks.Facts{}, "0.1.0", "TenantInvalid", []string{"not a semver constraint"}},
		{"cpu over", v1alpha1.TenantLimits{MaxCPU: q("1")}, hooks.Facts{CPUMilli: 1500}, "", "MaxCPUExceeded", []string{"1500m", "maxCPU 1"}},
		{"memory over", v1alpha1.TenantLimits{MaxMemory: q("1Gi")}, hooks.Facts{MemoryBytes: 2 * gi}, "", "MaxMemoryExceeded", []string{"2Gi", "maxMemory 1Gi"}},
		{"priority class refused", v1alpha1.TenantLimits{AllowedPriorityClasses: []string{"batch"}}, hooks.Facts{PriorityClassName: "system-cluster-critical"}, "", "PriorityClassNotAllowed", []string{"system-cluster-critical", "allowedPriorityClasses [batch]"}},
		{"priority class allowed", v1alpha1.TenantLimits{AllowedPriorityClasses: []string{"batch"}}, hooks.Facts{PriorityClassName: "batch"}, "", "", nil},
		{"no priority class asked", v1alpha1.TenantLimits{AllowedPriorityClasses: []string{"batch"}}, hooks.Facts{}, "", "", nil},
		{"toleration key refused", v1alpha1.TenantLimits{AllowedTolerationKeys: []string{"team-a"}}, hooks.Facts{TolerationKeys: []string{"team-a", "dedicated"}}, "", "TolerationNotAllowed", []string{"toleration key dedicated", "allowedTolerationKeys [team-a]"}},
		{"keyless toleration refused", v1alpha1.TenantLimits{AllowedTolerationKeys: []string{"team-a"}}, hooks.Facts{TolerationKeys: []string{""}}, "", "TolerationNotAllowed", []string{"without a key", `"*"`}},
		{"keyless toleration with *", v1alpha1.TenantLimits{AllowedTolerationKeys: []string{"*"}}, hooks.Facts{TolerationKeys: []string{""}}, "", "", nil},
		{"node placement refused", v1alpha1.TenantLimits{DenyNodePlacement: true}, hooks.Facts{NodePlacement: []string{"nodeSelector", "affinity"}}, "", "NodePlacementNotAllowed", []string{"nodeSelector and affinity", "denyNodePlacement"}},
		{"node placement not asked", v1alpha1.TenantLimits{DenyNodePlacement: true}, hooks.Facts{}, "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, msg, ok := Evaluate(tenant(tc.limits), object(tc.facts, tc.chart))
			if tc.reason == "" {
				if !ok {
					t.Fatalf("refused: %s %s", reason, msg)
				}
				return
			}
			if ok || reason != tc.reason {
				t.Fatalf("got ok=%v reason=%s, want %s", ok, reason, tc.reason)
			}
			for _, m := range tc.msg {
				if !strings.Contains(msg, m) {
					t.Errorf("message %q does not mention %q", msg, m)
				}
			}
		})
	}
}

func TestTotalStorage(t *testing.T) {
	ten := tenant(v1alpha1.TenantLimits{MaxTotalStorage: q("10Gi")})
	gi := int64(1 << 30)
	if _, _, ok := checkTotalStorage(ten, object(hooks.Facts{StorageBytes: 2 * gi, Replicas: 2}, ""), 6*gi); !ok {
		t.Error("10Gi of 10Gi refused")
	}
	reason, msg, ok := checkTotalStorage(ten, object(hooks.Facts{StorageBytes: 3 * gi, Replicas: 2}, ""), 6*gi)
	if ok || reason != "MaxTotalStorageExceeded" || !strings.Contains(msg, "12Gi") || !strings.Contains(msg, "maxTotalStorage 10Gi") {
		t.Errorf("12Gi of 10Gi: %v %s %q", ok, reason, msg)
	}
}

func TestTenantValues(t *testing.T) {
	ten := &v1alpha1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "acme"}, Spec: v1alpha1.TenantSpec{
		Values: []v1alpha1.TenantValues{
			{Kind: "Postgres", Values: jsonOf(`{"metrics":{"enabled":true},"parameters":{"a":"1"}}`)},
			{Kind: "chartpilot.dev/Postgres", Values: jsonOf(`{"parameters":{"b":"2"}}`)},
			{Kind: "Redis", Values: jsonOf(`{"image":{"tag":"x"}}`)},
		},
		Limits: v1alpha1.TenantLimits{DefaultStorageClass: "fast"},
	}}
	got, err := tenantValues(ten, object(hooks.Facts{StorageClassPath: []string{"storage", "storageClass"}}, ""))
	if err != nil {
		t.Fatal(err)
	}
	want := `map[metrics:map[enabled:true] parameters:map[a:1 b:2] storage:map[storageClass:fast]]`
	if s := fmtMap(got); s != want {
		t.Errorf("tenant values = %s\nwant %s", s, want)
	}
	// A resource naming its class keeps it.
	got, _ = tenantValues(ten, object(hooks.Facts{StorageClass: "slow", StorageClassPath: []string{"storage", "storageClass"}}, ""))
	if _, set := got["storage"]; set {
		t.Errorf("default class set over the resource's own: %v", got)
	}
}

func jsonOf(s string) apiextensionsv1.JSON { return apiextensionsv1.JSON{Raw: []byte(s)} }

func fmtMap(m map[string]any) string { return fmt.Sprint(m) }
