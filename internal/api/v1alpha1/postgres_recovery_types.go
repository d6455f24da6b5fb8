package v1alpha1

// PostgresBootstrap is how a new Postgres's data begins: an empty cluster
// (the default), or a recovery from a WAL archive.
type PostgresBootstrap struct {
	// Recovery starts the new server from a WAL archive (another
	// Postgres's spec.backup.walArchive, kept or deleted): its newest base
	// backup that ends before the target, and the archived WAL replayed to
	// the target, then promoted. Pod 0 recovers before its server first
	// starts; the other pods clone it. It runs once, for a cluster that
	// never had a primary: later pods, and a pod 0 whose volume is lost
	// after that, join the cluster as usual.
	// +optional
	Recovery *PostgresRecovery `json:"recovery,omitempty"`
}

// PostgresRecovery is the archive a new Postgres recovers from, and the
// point it stops at.
// +kubebuilder:validation:XValidation:rule="(has(self.targetTime) ? 1 : 0) + (has(self.targetLSN) ? 1 : 0) + (has(self.targetXID) ? 1 : 0) <= 1",message="set at most one of targetTime, targetLSN and targetXID"
type PostgresRecovery struct {
	// Source is the Postgres of this namespace whose archive is read (it
	// need not exist any longer): its archive is at NAMESPACE/SOURCE in
	// the store, unless Prefix says where.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Source string `json:"source"`
	// Prefix is the source's spec.backup.walArchive.prefix, when it set
	// one. The archive of the major of spec.version is read (PREFIX/pgMAJOR).
	// +optional
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:=@+,-]+(/[A-Za-z0-9_.:=@+,-]+)*$`
	Prefix string `json:"prefix,omitempty"`
	// Store holds the archive (default: spec.backup.store).
	// +optional
	Store *StoreRef `json:"store,omitempty"`
	// Encryption names the age identity of an encrypted archive (default:
	// spec.backup.encryption).
	// +optional
	Encryption *BackupEncryption `json:"encryption,omitempty"`
	// TargetTime: the recovery keeps every transaction committed at or
	// before this time (RFC 3339, fractions of a second allowed). With no
	// target, the recovery replays the whole archive.
	// +optional
	// +kubebuilder:validation:Format=date-time
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$`
	TargetTime string `json:"targetTime,omitempty"`
	// TargetLSN: the recovery stops at this WAL position (such as 0/3000028).
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$`
	TargetLSN string `json:"targetLSN,omitempty"`
	// TargetXID: the recovery stops after this transaction commits.
	// +optional
	// +kubebuilder:validation:Pattern=`^[1-9][0-9]{0,19}$`
	TargetXID string `json:"targetXID,omitempty"`
}

// Phases of a recovery.
const (
	RecoveryPending   = "Pending"
	RecoveryRunning   = "Running"
	RecoveryFailed    = "Failed"
	RecoveryCompleted = "Completed"
	// RecoverySkipped: pod 0 did not recover, and says why (the cluster
	// had a primary already).
	RecoverySkipped = "Skipped"
)

// PostgresRecoveryStatus is what became of spec.bootstrap.recovery.
type PostgresRecoveryStatus struct {
	// Phase: Pending (the release or pod 0 not there yet), Running,
	// Failed (retried by the kubelet; Message says why), Skipped (the
	// cluster had a primary already; Message says which) or Completed.
	Phase string `json:"phase"`
	// Message is the recovery's last word: where it stopped, or why it
	// cannot go on.
	// +optional
	Message string `json:"message,omitempty"`
	// Archive is the archive read (STORE-KIND/NAME:PREFIX).
	// +optional
	Archive string `json:"archive,omitempty"`
	// Target is what the recovery stopped at (a time, an LSN, a
	// transaction, or the end of the archive).
	// +optional
	Target string `json:"target,omitempty"`
	// BaseBackup is the base backup the recovery started from.
	// +optional
	BaseBackup string `json:"baseBackup,omitempty"`
	// Timeline is the timeline the recovered server was promoted on.
	// +optional
	Timeline int64 `json:"timeline,omitempty"`
	// LastTransactionTime is the commit time of the last transaction the
	// recovery replayed.
	// +optional
	LastTransactionTime string `json:"lastTransactionTime,omitempty"`
}

// ArchiveReport is a member's WAL archiving (AnnotationMemberArchive).
type ArchiveReport struct {
	// WAL is the last file archived, At when (Unix seconds).
	WAL string `json:"wal,omitempty"`
	At  int64  `json:"at,omitempty"`
	// Failed counts failed attempts since the server started; FailedWAL
	// is the last that failed, FailedAt when.
	Failed    int64  `json:"failed,omitempty"`
	FailedWAL string `json:"failedWAL,omitempty"`
	FailedAt  int64  `json:"failedAt,omitempty"`
	// Pending counts the files waiting to be archived.
	Pending int64 `json:"pending,omitempty"`
}

// States of a Postgres's WAL archiving.
const (
	ArchivingOK      = "Archiving"
	ArchivingFailing = "Failing"
	ArchivingBehind  = "Behind"
)

// PostgresArchivingStatus is the primary's WAL archiving as its instance
// manager last reported it: what changes seldom (the state and why); the
// figures that change with every file are metrics.
type PostgresArchivingStatus struct {
	// State is Archiving, Failing (the newest attempt failed) or Behind
	// (more files wait than the archive keeps up with).
	State string `json:"state"`
	// Message says why, naming the file that fails.
	// +optional
	Message string `json:"message,omitempty"`
	// Member is the member reporting (the primary).
	// +optional
	Member string `json:"member,omitempty"`
}
