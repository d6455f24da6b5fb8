package release

import (
	"fmt"
	"strings"
	"testing"
)

func statefulSet(size, class string) string {
	cls := ""
	if class != "" {
		cls = "\n        storageClassName: " + class
	}
	return `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  template: {metadata: {labels: {app: db}}, spec: {containers: [{name: c, image: x}]}}
  volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        accessModes: [ReadWriteOnce]` + cls + `
        resources: {requests: {storage: ` + size + `}}
`
}

func TestPlanGrowth(t *testing.T) {
	for _, c := range []struct {
		name                string
		before, after       string
		grows, pin, refusal string
	}{
		{"unchanged", statefulSet("1Gi", ""), statefulSet("1Gi", ""), "", "", ""},
		{"grows", statefulSet("1Gi", ""), statefulSet("2Gi", ""), "1Gi → 2Gi", "", ""},
		{"same size written otherwise", statefulSet("1Gi", ""), statefulSet("1024Mi", ""), "", "", ""},
		{"shrinks", statefulSet("2Gi", ""), statefulSet("1Gi", ""), "", "", "StorageShrink"},
		{"another class", statefulSet("1Gi", "fast"), statefulSet("1Gi", "slow"), "", "", "StorageClassChange"},
		{"the default class named", statefulSet("1Gi", ""), statefulSet("1Gi", "standard"), "", "standard", ""},
		{"no StatefulSet", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", statefulSet("2Gi", ""), "", "", ""},
	} {
		plan, refusal := planGrowth(c.before, c.after)
		switch {
		case c.refusal != "":
			if refusal == nil || refusal.reason != c.refusal || !strings.Contains(refusal.Error(), "nothing was changed") {
				t.Errorf("%s: want refusal %s saying nothing was changed, got %v", c.name, c.refusal, refusal)
			}
		case refusal != nil:
			t.Errorf("%s: refused: %v", c.name, refusal)
		case c.grows == "" && c.pin == "":
			if len(plan) != 0 {
				t.Errorf("%s: plan %v, want none", c.name, plan)
			}
		default:
			if len(plan) != 1 || plan[0].pin != c.pin || (c.grows != "" && !strings.Contains(describeGrowth(plan), c.grows)) {
				t.Errorf("%s: plan %s (pin %q), want %q pin %q", c.name, describeGrowth(plan), plan[0].pin, c.grows, c.pin)
			}
		}
	}
}

func TestPlanReplace(t *testing.T) {
	renamed := strings.Replace(statefulSet("1Gi", ""), "name: data}", "name: data-pg17}", 1)
	for _, c := range []struct {
		name          string
		before, after string
		want          string
	}{
		{"unchanged", statefulSet("1Gi", ""), statefulSet("1Gi", ""), ""},
		{"grows only", statefulSet("1Gi", ""), statefulSet("2Gi", ""), ""},
		{"renamed", statefulSet("1Gi", ""), renamed, "db [data] → [data-pg17]"},
		{"renamed back", renamed, statefulSet("1Gi", ""), "db [data-pg17] → [data]"},
		{"new StatefulSet", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", renamed, ""},
	} {
		var got []string
		for _, r := range planReplace(c.before, c.after) {
			got = append(got, fmt.Sprintf("%s %v → %v", r.statefulSet, r.from, r.to))
		}
		if strings.Join(got, "; ") != c.want {
			t.Errorf("%s: %q, want %q", c.name, strings.Join(got, "; "), c.want)
		}
	}
}
