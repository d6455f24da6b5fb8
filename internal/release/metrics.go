package release

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics on the manager's endpoint. Their registration is the only global
// mutable state of the package.
var (
	releaseInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_release_info",
		Help: "One series per managed release with its chart, version and Helm status; value 1.",
	}, []string{"kind", "namespace", "name", "chart", "version", "status"})
	reconcileTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chartpilot_reconcile_total",
		Help: "Reconcile passes by kind and result (success, requeue, error).",
	}, []string{"kind", "result"})
	reconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "chartpilot_reconcile_duration_seconds",
		Help:    "Duration of reconcile passes by kind and result.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
	}, []string{"kind", "result"})
	helmActionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "chartpilot_helm_action_duration_seconds",
		Help:    "Duration of Helm actions by action (install, upgrade, rollback, uninstall) and result.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
	}, []string{"action", "result"})
	rendersSkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chartpilot_renders_skipped_total",
		Help: "Reconcile passes that found the release in sync from metadata alone: no chart rendered, nothing written.",
	}, []string{"kind"})
	upgradesInProgress = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_upgrades_in_progress",
		Help: "Releases upgrading now (from the upgrade until healthy), bounded by maxConcurrentUpgrades.",
	}, []string{"kind"})
	rolloutWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_rollout_waiting",
		Help: "Resources whose chart version upgrade waits, by reason (WaitingForMaintenanceWindow, WaitingForCanaries, RolloutHalted, UpgradeQueued, InvalidMaintenanceWindow).",
	}, []string{"kind", "reason"})
	rolloutHalted = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_rollout_halted",
		Help: "1 while the rollout of a chart version is halted because a canary failed on it, else 0.",
	}, []string{"kind", "version"})
	rolloutUpgrades = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chartpilot_rollout_upgrades_total",
		Help: "Chart version upgrades by target version and result (deployed, rolled_back).",
	}, []string{"kind", "version", "result"})
	workloadsUnavailable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_workloads_unavailable",
		Help: "Resources whose workloads, seen healthy before, are not available now (WorkloadsAvailable=False).",
	}, []string{"kind"})
	deprecatedAPIObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_release_deprecated_api_objects",
		Help: "Objects of a release's stored manifest at an API version that a Kubernetes minor (removed_in) stops serving, by API version and kind.",
	}, []string{"kind", "namespace", "name", "api_version", "api_kind", "removed_in"})
	driftChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chartpilot_drift_checks_total",
		Help: "Drift checks by kind and outcome (none, corrected, failed).",
	}, []string{"kind", "outcome"})
)

func init() {
	metrics.Registry.MustRegister(releaseInfo, reconcileTotal, reconcileDuration, helmActionDuration, rendersSkipped, driftChecks, upgradesInProgress, rolloutWaiting, rolloutHalted, rolloutUpgrades, workloadsUnavailable, deprecatedAPIObjects)
}
