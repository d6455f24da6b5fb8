package helm

import (
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// Lint runs `helm lint` on a chart directory with values, and returns every
// finding at warning level or above (an info-level finding, such as a
// missing icon, is not returned).
func Lint(dir string, vals map[string]any) []string {
	linter := lint.All(dir, copyValues(vals), "default", false)
	var out []string
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			out = append(out, m.Error())
		}
	}
	return out
}
