package kubeapis

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

func TestLookupReadsTheTypesLifecycle(t *testing.T) {
	vac := schema.GroupVersionKind{Group: "storage.k8s.io", Version: "v1beta1", Kind: "VolumeAttributesClass"}
	l, ok := Lookup(vac)
	if !ok {
		t.Fatal("storage.k8s.io/v1beta1 VolumeAttributesClass: no lifecycle")
	}
	if l.Deprecated != 34 || l.Removed != 37 || l.ReplacementAPIVersion() != "storage.k8s.io/v1" || l.Replacement.Kind != "VolumeAttributesClass" {
		t.Errorf("VolumeAttributesClass v1beta1: got %+v, want deprecated 1.34, removed 1.37, replaced by storage.k8s.io/v1", l)
	}
	for _, gvk := range []schema.GroupVersionKind{
		{Group: "apps", Version: "v1", Kind: "Deployment"},
		{Version: "v1", Kind: "ConfigMap"},
		{Group: "chartpilot.dev", Version: "v1alpha1", Kind: "Postgres"},
	} {
		if l, ok := Lookup(gvk); ok {
			t.Errorf("%s: a GA or unknown kind has no removal, got %+v", gvk, l)
		}
	}
	hpa, ok := Lookup(schema.GroupVersionKind{Group: "autoscaling", Version: "v2beta2", Kind: "HorizontalPodAutoscaler"})
	if !ok || hpa.Removed != 26 || hpa.ReplacementAPIVersion() != "autoscaling/v2" {
		t.Errorf("autoscaling/v2beta2 HorizontalPodAutoscaler (a type k8s.io/api no longer has): got %+v %v", hpa, ok)
	}
}

// TestGoneAreGone keeps the hand-written table to what k8s.io/api cannot
// say: a row whose type is still defined is to be removed from it.
func TestGoneAreGone(t *testing.T) {
	for gvk := range gone {
		if scheme.Scheme.Recognizes(gvk) {
			t.Errorf("%s is defined by k8s.io/api: read its lifecycle from the type, not from the table", gvk)
		}
	}
}

func TestParseMinor(t *testing.T) {
	for in, want := range map[string]Minor{"1.38": 38, "v1.35.4": 35, "1.36.0-rc.1": 36, "1.37+": 37, " 1.40 ": 40} {
		if got, err := ParseMinor(in); err != nil || got != want {
			t.Errorf("ParseMinor(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "38", "2.1", "1.", "1.x", "v1.-3"} {
		if _, err := ParseMinor(in); err == nil || !strings.Contains(err.Error(), "1.MINOR") {
			t.Errorf("ParseMinor(%q): want an error naming the form, got %v", in, err)
		}
	}
}

func TestUsesBreaksAndDue(t *testing.T) {
	vac := schema.GroupVersionKind{Group: "storage.k8s.io", Version: "v1beta1", Kind: "VolumeAttributesClass"}
	dc := schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1beta1", Kind: "DeviceClass"}
	cm := schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	asked := map[schema.GroupVersionKind]int{}
	uses := Uses([]schema.GroupVersionKind{cm, dc, vac, vac, cm}, func(g schema.GroupVersionKind) bool {
		asked[g]++
		return g != dc
	})
	if len(uses) != 2 || uses[0].Kind != "VolumeAttributesClass" || uses[0].Objects != 2 || uses[1].Kind != "DeviceClass" {
		t.Fatalf("Uses: got %+v, want VolumeAttributesClass (2 objects, removed first), then DeviceClass", uses)
	}
	if asked[vac] != 1 || asked[cm] != 0 {
		t.Errorf("served asked %v: once per removable kind, never for the others", asked)
	}
	v, d := uses[0], uses[1]
	if v.Breaks(36) || !v.Breaks(37) || !v.Breaks(38) {
		t.Errorf("VolumeAttributesClass v1beta1 (removed in 1.37) breaks on 1.36/1.37/1.38: %v %v %v", v.Breaks(36), v.Breaks(37), v.Breaks(38))
	}
	if !d.Breaks(30) {
		t.Error("a kind the cluster does not serve breaks on any minor")
	}
	if v.Due(32) || !v.Due(34) || !v.Due(36) {
		t.Errorf("Due: 1.32 (nothing yet) %v, 1.34 (deprecated) %v, 1.36 (removed next) %v", v.Due(32), v.Due(34), v.Due(36))
	}
	for want, u := range map[string]Use{
		"storage.k8s.io/v1beta1 VolumeAttributesClass (2 objects) is removed in Kubernetes 1.37: use storage.k8s.io/v1 VolumeAttributesClass": v,
		"resource.k8s.io/v1beta1 DeviceClass is not served by this cluster: use resource.k8s.io/v1 DeviceClass":                               d,
	} {
		if got := u.Describe(); got != want {
			t.Errorf("Describe:\n got %s\nwant %s", got, want)
		}
	}
}
