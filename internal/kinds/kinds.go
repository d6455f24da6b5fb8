// Package kinds registers chartpilot's typed kinds: for each, the Go
// translator that maps its spec onto chart values and the status it reports.
// A kind listed in watches.yaml that is not registered here is passthrough:
// its spec is the chart's values.
package kinds

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/kinds/postgres"
	"github.com/chartpilot/chartpilot/internal/release"
)

// Builtin returns the typed kinds by GVK.
func Builtin() map[schema.GroupVersionKind]release.Kind {
	return map[schema.GroupVersionKind]release.Kind{
		postgres.GVK: postgres.Kind(),
	}
}
