package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PostgresBackup schedules backups: each a Backup named
// <name>-<scheduled time>, run as a Job.
type PostgresBackup struct {
	// Store the backups go to.
	Store StoreRef `json:"store"`
	// Schedule in 5-field cron format (minute hour day-of-month month
	// day-of-week, UTC), e.g. "30 2 * * *". Schedules missed while the
	// operator was down are made up by one backup, not one per miss.
	// +kubebuilder:validation:MinLength=9
	// +kubebuilder:validation:MaxLength=100
	Schedule string `json:"schedule"`
	// Retention of scheduled backups; none: all are kept.
	// +optional
	Retention *BackupRetention `json:"retention,omitempty"`
	// Compression of the dump: zstd (default) or none.
	// +optional
	// +kubebuilder:validation:Enum=zstd;none
	Compression string `json:"compression,omitempty"`
	// Encryption, on the Job's side, before anything reaches the store.
	// +optional
	Encryption *BackupEncryption `json:"encryption,omitempty"`
	// Verify schedules restore drills (cron, or @weekly, @daily): the newest
	// completed backup is restored into a throwaway database of the
	// server, its tables counted, and the database dropped.
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Verify string `json:"verify,omitempty"`
	// Suspend stops new scheduled backups (on-demand Backups still run).
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// WALArchive archives the WAL continuously to the same store, beside
	// the backups: every pod's server hands each finished WAL file to
	// chartpilot's agent, compressed, encrypted like the backups, and
	// acknowledged only once it is stored. With base backups it makes
	// recovery to any point in time possible. The store must be s3, gcs or
	// azure (the server's pods reach it themselves).
	// +optional
	WALArchive *PostgresWALArchive `json:"walArchive,omitempty"`
}

// PostgresWALArchive is the continuous archiving of the WAL.
type PostgresWALArchive struct {
	// ArchiveTimeout: with writes going on, a WAL file is archived at
	// least this often, which bounds what a lost volume costs when the
	// database is quiet (whole seconds, 1s to 1h; default 60s).
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="archiveTimeout must be between 1s and 1h"
	ArchiveTimeout *metav1.Duration `json:"archiveTimeout,omitempty"`
	// Prefix is the archive's key prefix within the store (default:
	// NAMESPACE/NAME): segments of letters, digits and _.:=@+,- joined by /.
	// Each PostgreSQL major archives below PREFIX/pgMAJOR (a major upgrade
	// starts a new archive). A new Postgres needs a prefix no other server
	// archived to: the archive never overwrites a file, so archiving to a
	// used one fails.
	// +optional
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:=@+,-]+(/[A-Za-z0-9_.:=@+,-]+)*$`
	Prefix string `json:"prefix,omitempty"`
	// BaseBackupSchedule is when a base backup (a physical Backup) of the
	// server is taken into the archive, a cron expression (default
	// "0 0 * * *", daily). One is also taken as soon as the archive of
	// the server's major has none: a new archive, or the new major's
	// after a major upgrade. spec.backup.suspend stops both.
	// +optional
	// +kubebuilder:validation:MinLength=9
	BaseBackupSchedule string `json:"baseBackupSchedule,omitempty"`
	// RecoveryWindow is how far back a recovery must reach, in days or
	// hours (such as 7d or 36h): once a day a Job prunes the archive of
	// what no point in the window needs (older base backups, then the WAL
	// before the oldest base backup kept). Unset: nothing is pruned.
	// +optional
	// +kubebuilder:validation:Pattern=`^([1-9][0-9]{0,3}d|[1-9][0-9]{0,5}h)$`
	RecoveryWindow string `json:"recoveryWindow,omitempty"`
}

// PostgresArchiveStatus is what a WAL archive can recover to.
type PostgresArchiveStatus struct {
	// FirstRecoverableTime is the earliest point a recovery can stop at
	// (the end of the oldest base backup).
	// +optional
	FirstRecoverableTime *metav1.Time `json:"firstRecoverableTime,omitempty"`
	// LastArchivedTime is when the newest WAL file was archived, and
	// LastArchivedWAL its name: no commit after it is in the archive.
	// +optional
	LastArchivedTime *metav1.Time `json:"lastArchivedTime,omitempty"`
	// +optional
	LastArchivedWAL string `json:"lastArchivedWAL,omitempty"`
	// BaseBackups and Files count what the archive holds.
	// +optional
	BaseBackups int `json:"baseBackups,omitempty"`
	// +optional
	Files int `json:"files,omitempty"`
	// CheckedAt is when the archive was read.
	// +optional
	CheckedAt *metav1.Time `json:"checkedAt,omitempty"`
}

// DefaultBaseBackupSchedule is spec.backup.walArchive.baseBackupSchedule's
// default: daily at midnight.
const DefaultBaseBackupSchedule = "0 0 * * *"

// BackupRetention says which scheduled backups are kept: the newest Count
// and those younger than MaxAge (either rule may be left out); the newest
// complete backup is always kept.
// +kubebuilder:validation:XValidation:rule="has(self.count) || has(self.maxAge)",message="set count, maxAge or both"
type BackupRetention struct {
	// +optional
	// +kubebuilder:validation:Minimum=1
	Count int `json:"count,omitempty"`
	// MaxAge, a duration such as 720h.
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
}

// BackupEncryption names the age X25519 key backups are encrypted for.
type BackupEncryption struct {
	// KeySecretRef names a key of a Secret of the namespace holding an age
	// X25519 identity (AGE-SECRET-KEY-1…; restores need it) or only its
	// recipient (age1…).
	KeySecretRef LocalSecretKeyRef `json:"keySecretRef"`
}

// LocalSecretKeyRef names a key of a Secret of the object's namespace.
type LocalSecretKeyRef struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// PostgresBackupStatus reports the scheduled backups.
type PostgresBackupStatus struct {
	// LastScheduleTime is the schedule time of the newest scheduled Backup.
	// +optional
	LastScheduleTime *metav1.Time `json:"lastScheduleTime,omitempty"`
	// NextScheduleTime is when the next one is due.
	// +optional
	NextScheduleTime *metav1.Time `json:"nextScheduleTime,omitempty"`
	// LastBackup is the newest Backup of the resource, and its phase.
	// +optional
	LastBackup string `json:"lastBackup,omitempty"`
	// +optional
	LastBackupPhase string `json:"lastBackupPhase,omitempty"`
	// LastSuccessfulBackup is the newest completed Backup.
	// +optional
	LastSuccessfulBackup string `json:"lastSuccessfulBackup,omitempty"`
	// +optional
	LastSuccessTime *metav1.Time `json:"lastSuccessTime,omitempty"`
	// VerifyJob is the restore drill running now.
	// +optional
	VerifyJob string `json:"verifyJob,omitempty"`
	// LastVerifyTime is the schedule time of the newest restore drill.
	// +optional
	LastVerifyTime *metav1.Time `json:"lastVerifyTime,omitempty"`
	// LastVerifiedBackup is the newest Backup a drill restored.
	// +optional
	LastVerifiedBackup string `json:"lastVerifiedBackup,omitempty"`
	// LastVerifyResult says how the newest drill ended.
	// +optional
	LastVerifyResult string `json:"lastVerifyResult,omitempty"`
	// LastBaseBackup is the newest completed physical Backup (a base
	// backup into the WAL archive) of the server's major, and when it
	// completed; NextBaseBackupTime when the schedule takes the next.
	// +optional
	LastBaseBackup string `json:"lastBaseBackup,omitempty"`
	// +optional
	LastBaseBackupTime *metav1.Time `json:"lastBaseBackupTime,omitempty"`
	// +optional
	NextBaseBackupTime *metav1.Time `json:"nextBaseBackupTime,omitempty"`
	// PruneJob is the running Job that prunes the WAL archive to
	// spec.backup.walArchive.recoveryWindow; LastPruneTime when the
	// newest started, LastPruneResult what became of it.
	// +optional
	PruneJob string `json:"pruneJob,omitempty"`
	// +optional
	LastPruneTime *metav1.Time `json:"lastPruneTime,omitempty"`
	// +optional
	LastPruneResult string `json:"lastPruneResult,omitempty"`
	// Archive is what the WAL archive could recover to when the newest
	// prune read it.
	// +optional
	Archive *PostgresArchiveStatus `json:"archive,omitempty"`
}
