package storage

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

func mustSettings(t *testing.T, a v1alpha1.StorageAutoExpand) settings {
	t.Helper()
	s, err := parseSettings(&a, "spec.storage.autoExpand")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNextSize(t *testing.T) {
	for _, c := range []struct {
		step, max, size, want string
	}{
		{"", "100Gi", "1Gi", "2Gi"},         // 25% of 1Gi is below the 1Gi least step
		{"", "100Gi", "10Gi", "12800Mi"},    // 25%
		{"", "11Gi", "10Gi", "11Gi"},        // capped at max
		{"50%", "100Gi", "8Gi", "12Gi"},     // 50%
		{"5Gi", "100Gi", "8Gi", "13Gi"},     // a quantity
		{"10%", "100Gi", "15Gi", "16896Mi"}, // 1.5Gi
		{"512Mi", "100Gi", "10Gi", "11Gi"},  // at least 1Gi
		{"", "100Gi", "3001Mi", "4025Mi"},   // 3001Mi + 1Gi
	} {
		s := mustSettings(t, v1alpha1.StorageAutoExpand{Enabled: true, Step: c.step, Max: c.max})
		got := s.nextSize(resource.MustParse(c.size))
		if got.Cmp(resource.MustParse(c.want)) != 0 {
			t.Errorf("step %q max %s: %s → %s, want %s", c.step, c.max, c.size, got.String(), c.want)
		}
	}
}

func TestParseSettingsRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		a    v1alpha1.StorageAutoExpand
		says string
	}{
		{v1alpha1.StorageAutoExpand{Enabled: true}, "max is required"},
		{v1alpha1.StorageAutoExpand{Enabled: true, Max: "lots"}, "max \"lots\""},
		{v1alpha1.StorageAutoExpand{Enabled: true, Max: "1Gi", Step: "0%"}, "step"},
		{v1alpha1.StorageAutoExpand{Enabled: true, Max: "1Gi", Step: "-1Gi"}, "step"},
		{v1alpha1.StorageAutoExpand{Enabled: true, Max: "1Gi", ThresholdPercent: 30}, "threshold 30"},
	} {
		_, err := parseSettings(&c.a, "spec.storage.autoExpand")
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.HasPrefix(err.Error(), "spec.storage.autoExpand") {
			t.Errorf("%+v: want an error naming the field and saying %q, got %v", c.a, c.says, err)
		}
	}
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := mustSettings(t, v1alpha1.StorageAutoExpand{Enabled: true, Max: "4Gi"})
	one := resource.MustParse("1Gi")
	recent := &v1alpha1.StorageExpansion{At: metav1.NewTime(now.Add(-5 * time.Minute)), From: "512Mi", To: "1Gi"}
	old := &v1alpha1.StorageExpansion{At: metav1.NewTime(now.Add(-11 * time.Minute)), From: "512Mi", To: "1Gi"}
	for _, c := range []struct {
		name   string
		size   resource.Quantity
		used   int32
		last   *v1alpha1.StorageExpansion
		grow   bool
		reason string
	}{
		{"below the threshold", one, 79, nil, false, "Watching"},
		{"at the threshold", one, 80, nil, true, "Expanded"},
		{"within the window", one, 95, recent, false, "Waiting"},
		{"after the window", one, 95, old, true, "Expanded"},
		{"at the maximum", resource.MustParse("4Gi"), 99, nil, false, "AtMaximum"},
	} {
		v := decide(s, c.size, "data-db-0", c.used, c.last, now, time.Minute)
		if v.grow != c.grow || v.reason != c.reason {
			t.Errorf("%s: grow=%v reason=%s (%s), want grow=%v reason=%s", c.name, v.grow, v.reason, v.msg, c.grow, c.reason)
		}
		if v.reason == "Waiting" && v.recheck > time.Minute {
			t.Errorf("%s: looks again in %s, later than the interval", c.name, v.recheck)
		}
	}
}
