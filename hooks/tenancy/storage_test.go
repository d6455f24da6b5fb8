package tenancy

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
)

func claim(ns, name, instance, size string, bound string) corev1.PersistentVolumeClaim {
	c := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if instance != "" {
		c.Labels = map[string]string{LabelInstance: instance}
	}
	c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
	if bound != "" {
		c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(bound)}
	}
	return c
}

func named(ns, name string, storage int64, replicas int64) hooks.Object {
	u := &unstructured.Unstructured{}
	u.SetKind("Postgres")
	u.SetNamespace(ns)
	u.SetName(name)
	return hooks.Object{Resource: u, Facts: hooks.Facts{StorageBytes: storage, Replicas: replicas}}
}

// TestTenantStorageCountsClaims: a resource counts the larger of its spec
// and its claims; claims of no resource (kept after a delete, unlabelled)
// count whole.
func TestTenantStorageCountsClaims(t *testing.T) {
	gi := int64(1 << 30)
	for _, tc := range []struct {
		name      string
		resources []hooks.Object
		claims    []corev1.PersistentVolumeClaim
		want      int64
	}{
		{"specs only", []hooks.Object{named("a", "db", 2*gi, 2)}, nil, 4 * gi},
		{"claims of the spec's size", []hooks.Object{named("a", "db", 2*gi, 2)},
			[]corev1.PersistentVolumeClaim{claim("a", "data-db-0", "db", "2Gi", "2Gi"), claim("a", "data-db-1", "db", "2Gi", "")}, 4 * gi},
		{"an old volume kept after a major upgrade", []hooks.Object{named("a", "db", 2*gi, 1)},
			[]corev1.PersistentVolumeClaim{claim("a", "data-db-0", "db", "2Gi", "2Gi"), claim("a", "data17-db-0", "db", "2Gi", "2Gi")}, 4 * gi},
		{"a claim kept after its resource was deleted", []hooks.Object{named("a", "db", 2*gi, 1)},
			[]corev1.PersistentVolumeClaim{claim("a", "data-old-0", "old", "5Gi", "5Gi")}, 7 * gi},
		{"an unlabelled claim", nil, []corev1.PersistentVolumeClaim{claim("a", "scratch", "", "1Gi", "")}, gi},
		{"a bound claim larger than asked", []hooks.Object{named("a", "db", gi, 1)},
			[]corev1.PersistentVolumeClaim{claim("a", "data-db-0", "db", "1Gi", "3Gi")}, 3 * gi},
		{"the same name in another namespace", []hooks.Object{named("a", "db", gi, 1)},
			[]corev1.PersistentVolumeClaim{claim("b", "data-db-0", "db", "4Gi", "")}, 5 * gi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := TenantStorage(tc.resources, tc.claims, nil); got != tc.want {
				t.Errorf("tenantStorage = %d GiB, want %d GiB", got/gi, tc.want/gi)
			}
		})
	}
}

// TestClaimKeptAfterDeleteCountsAgainstTheLimit: with a 10Gi total, a new
// 5Gi resource is refused while a deleted resource's 6Gi claim is kept,
// and accepted once it is gone.
func TestClaimKeptAfterDeleteCountsAgainstTheLimit(t *testing.T) {
	ten := &v1alpha1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "acme"}, Spec: v1alpha1.TenantSpec{Namespaces: []string{"a"},
		Limits: v1alpha1.TenantLimits{MaxTotalStorage: q("10Gi")}}}
	kept := []corev1.PersistentVolumeClaim{claim("a", "data-gone-0", "gone", "6Gi", "6Gi")}
	tn := &Tenancy{Claims: func(context.Context, string) ([]corev1.PersistentVolumeClaim, error) { return kept, nil }}
	claims, err := tn.ClaimsIn(context.Background(), ten.Spec.Namespaces)
	if err != nil {
		t.Fatal(err)
	}
	obj := named("a", "db", 5<<30, 1)
	sum, own := TenantStorage(nil, claims, &obj)
	if sum != 6<<30 || own != 0 {
		t.Fatalf("others %d, own %d", sum, own)
	}
	reason, msg, ok := checkTotalStorage(ten, obj, sum)
	if ok || reason != "MaxTotalStorageExceeded" || !strings.Contains(msg, "claims kept after deletes") {
		t.Fatalf("a 5Gi resource beside a kept 6Gi claim under a 10Gi limit: %v %s %s", ok, reason, msg)
	}
	kept = nil
	sum, _ = TenantStorage(nil, kept, &obj)
	if _, _, ok := checkTotalStorage(ten, obj, sum); !ok {
		t.Fatal("refused once the kept claim was deleted")
	}
}
