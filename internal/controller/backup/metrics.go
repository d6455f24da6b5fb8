package backup

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Backup metrics, by namespace, target kind and name, and store.
var (
	backupLabels      = []string{"namespace", "kind", "name", "store"}
	backupLastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_backup_last_success_timestamp_seconds",
		Help: "When the last logical backup of the resource to the store completed (Unix time).",
	}, backupLabels)
	baseBackupLastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_backup_base_last_success_timestamp_seconds",
		Help: "When the last physical base backup of the resource into its WAL archive's store completed (Unix time).",
	}, backupLabels)
	backupDuration = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_backup_duration_seconds",
		Help: "How long the last completed backup of the resource took, from its Job's start.",
	}, backupLabels)
	backupSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_backup_size_bytes",
		Help: "Bytes stored by the last completed backup of the resource (compressed, encrypted).",
	}, backupLabels)
	verifyLastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "chartpilot_backup_verify_last_success_timestamp_seconds",
		Help: "When a restore drill last restored a backup of the resource (Unix time).",
	}, []string{"namespace", "kind", "name"})
	verifyFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chartpilot_backup_verify_failures_total",
		Help: "Restore drills of the resource that failed.",
	}, []string{"namespace", "kind", "name"})
	backupFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chartpilot_backup_failures_total",
		Help: "Backups of the resource that failed, including those that could not start.",
	}, backupLabels)
)

func init() {
	metrics.Registry.MustRegister(backupLastSuccess, baseBackupLastSuccess, backupDuration, backupSize, backupFailures, verifyLastSuccess, verifyFailures)
}
