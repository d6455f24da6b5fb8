package operator

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/chartpilot/chartpilot/internal/apiretry"
)

// apiRetries counts requests to the API server sent again after a
// transient failure.
var apiRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "chartpilot_api_retries_total",
	Help: "Requests to the API server sent again after a transient failure, by method and by the failed attempt's HTTP status (or connection).",
}, []string{"method", "reason"})

func init() { metrics.Registry.MustRegister(apiRetries) }

// withRetries is cfg whose clients retry transient failures of single
// requests, so one lost request does not fail a whole Helm action.
func withRetries(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	apiretry.Wrap(cfg, apiretry.DefaultPolicy, func(method, reason string) { apiRetries.WithLabelValues(method, reason).Inc() })
	return cfg
}
