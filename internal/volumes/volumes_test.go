package volumes

import (
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCheckExpansion(t *testing.T) {
	yes, no := true, false
	class := func(allow *bool) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, AllowVolumeExpansion: allow}
	}
	for _, tc := range []struct {
		name  string
		class string
		sc    *storagev1.StorageClass
		says  []string // empty: may grow
	}{
		{"expandable class", "fast", class(&yes), nil},
		{"class that does not allow it", "fast", class(&no), []string{`StorageClass "fast" does not allow it`, `allowVolumeExpansion: true on StorageClass "fast", or keep`}},
		{"class that does not say", "fast", class(nil), []string{"allowVolumeExpansion is not true"}},
		{"no such class", "gone", nil, []string{`StorageClass "gone" does not exist: keep`}},
		{"no class at all", "", nil, []string{"the claim has no StorageClass: keep"}},
	} {
		r := CheckExpansion(tc.class, tc.sc)
		if (r == nil) != (tc.says == nil) {
			t.Errorf("%s: refusal %+v", tc.name, r)
			continue
		}
		if r == nil {
			continue
		}
		msg := r.Message("spec.storage.size: 1Gi → 2Gi", "keep spec.storage.size at 1Gi")
		if !strings.HasPrefix(msg, "spec.storage.size: 1Gi → 2Gi needs volume expansion, and ") || !strings.HasSuffix(msg, "keep spec.storage.size at 1Gi") {
			t.Errorf("%s: %q", tc.name, msg)
		}
		for _, s := range tc.says {
			if !strings.Contains(msg, s) {
				t.Errorf("%s: %q does not say %q", tc.name, msg, s)
			}
		}
	}
}
