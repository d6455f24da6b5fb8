package kinds

import (
	"strings"
	"testing"
	"time"
)

func TestParseAutoExpand(t *testing.T) {
	a, err := ParseAutoExpand("max=20Gi, threshold=85,step=5Gi,window=30m")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Enabled || a.Max != "20Gi" || a.ThresholdPercent != 85 || a.Step != "5Gi" || a.Window.Duration != 30*time.Minute {
		t.Errorf("parsed %+v", a)
	}
	for in, says := range map[string]string{
		"threshold=80":         "max is required",
		"max=20Gi,threshold=5": "threshold=5",
		"max=20Gi,window=1s":   "window=1s",
		"max=20Gi,speed=fast":  `unknown key "speed"`,
		"max":                  "not key=value",
	} {
		_, err := ParseAutoExpand(in)
		if err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "chartpilot.dev/auto-expand") {
			t.Errorf("%q: want an error naming the annotation and saying %q, got %v", in, says, err)
		}
	}
}
