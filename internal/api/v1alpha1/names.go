package v1alpha1

// The wire names: every label, annotation and finalizer chartpilot reads or
// writes on objects, in one place. What a user sets is documented in
// docs/; the rest is chartpilot's own bookkeeping, which anyone who may
// write the objects can edit, so none of it is trusted for more than its
// owner's own rights (release records are signed: LabelRecordMAC).

// Finalizer is put on every managed custom resource before its first install.
const Finalizer = "chartpilot.dev/uninstall"

// Annotations a user sets on a managed custom resource.
const (
	// AnnotationPause stops all actions while set to "true".
	AnnotationPause = "chartpilot.dev/pause"
	// AnnotationForceUpgrade: a new value forces one upgrade with object replacement.
	AnnotationForceUpgrade = "chartpilot.dev/force-upgrade"
	// AnnotationReconcileRequestedAt: a new value reconciles now, checks drift
	// and clears the back-off of a failed action.
	AnnotationReconcileRequestedAt = "chartpilot.dev/reconcile-requested-at"
	// AnnotationAdopt "true" lets chartpilot take over a release of the same
	// name that it did not install.
	AnnotationAdopt = "chartpilot.dev/adopt"
	// AnnotationChartVersion is a semver constraint on the chart version for
	// kinds without a spec.chartVersion field.
	AnnotationChartVersion = "chartpilot.dev/chart-version"
	// AnnotationAllowMajorUpgrade lists the major versions (of the chart, or
	// of the software a kind names) the resource may be upgraded to.
	AnnotationAllowMajorUpgrade = "chartpilot.dev/allow-major-upgrade"
	// AnnotationAllowDowngrade is the exact version a downgrade to is allowed.
	AnnotationAllowDowngrade = "chartpilot.dev/allow-downgrade"
	// AnnotationMaintenanceWindow limits chart version upgrades to windows
	// such as "Sat 02:00-04:00 UTC" (on the resource or its namespace).
	AnnotationMaintenanceWindow = "chartpilot.dev/maintenance-window"
	// AnnotationRestoreFrom names a completed Backup restored into a new
	// resource of a passthrough kind before its release is installed.
	AnnotationRestoreFrom = "chartpilot.dev/restore-from"
	// AnnotationAutoExpand turns automatic volume growth on for a resource
	// of a kind without typed storage fields (watches.yaml
	// storage.sizeValue names the value it grows): "max=20Gi" with
	// optional ",threshold=80,step=25%,window=10m".
	AnnotationAutoExpand = "chartpilot.dev/auto-expand"
	// AnnotationMonitoring "true" asks for the monitoring of a resource of
	// a kind whose watch has a monitoring block (typed Postgres uses
	// spec.monitoring).
	AnnotationMonitoring = "chartpilot.dev/monitoring"
)

// LabelCanary "true" makes a resource a canary: it upgrades to a new chart
// version first, and the others wait until every canary has been Ready on
// it for the watch's canarySoak.
const LabelCanary = "chartpilot.dev/canary"

// Labels chartpilot stores on release records (Helm storage Secrets).
const (
	// LabelOwnerUID and LabelOwnerKind name the resource the release is of.
	LabelOwnerUID  = "chartpilot.dev/owner-uid"
	LabelOwnerKind = "chartpilot.dev/owner-kind"
	// LabelDigest is the keyed digest of the inputs a revision was made from.
	LabelDigest = "chartpilot.dev/digest"
	// LabelForceToken is the force-upgrade value a revision was made under.
	LabelForceToken = "chartpilot.dev/force-token"
	// LabelRequestedAt holds the reconcile-requested-at token an action ran
	// under: a failed revision is retried at once when the token changes.
	LabelRequestedAt = "chartpilot.dev/requested-at"
	// LabelChartVersion and LabelAppMajor say what a revision deployed,
	// read by the version policy without decoding the records.
	LabelChartVersion = "chartpilot.dev/chart-version"
	LabelAppMajor     = "chartpilot.dev/app-major"
	// LabelHolder, LabelHolderLease, LabelHolderLeaseNS and LabelStartedAt
	// say who started the action a revision records, and when: an action
	// left pending is unlocked only once its holder is gone.
	LabelHolder        = "chartpilot.dev/holder"
	LabelHolderLease   = "chartpilot.dev/holder-lease"
	LabelHolderLeaseNS = "chartpilot.dev/holder-lease-namespace"
	LabelStartedAt     = "chartpilot.dev/started-at"
	// LabelRecordMAC is the record's MAC (HMAC-SHA256 over what the
	// record says, with the operator's key).
	LabelRecordMAC = "chartpilot.dev/mac"
	// LabelRecordChunks and LabelRecordDigest are on the record of a
	// release too large for one Secret: how many chunk Secrets hold its
	// body, and the SHA-256 of the whole body (base32, lower case). Each
	// chunk carries the digest and its index (LabelRecordChunk).
	LabelRecordChunks = "chartpilot.dev/record-chunks"
	LabelRecordDigest = "chartpilot.dev/record-digest"
	LabelRecordChunk  = "chartpilot.dev/record-chunk"
)

// Labels and annotations chartpilot puts on every object of a release.
// Helm itself sets app.kubernetes.io/managed-by=Helm on every object it
// applies and refuses to upgrade objects without it (its ownership check),
// so chartpilot's own label LabelRelease is what dependent informers select
// on.
const (
	LabelRelease    = "chartpilot.dev/release"
	AnnotationOwner = "chartpilot.dev/owner"
)

// Annotations of a PostgreSQL member's Lease, and the labels of the pods.
const (
	AnnotationMemberAddress = "chartpilot.dev/address"
	AnnotationMemberRole    = "chartpilot.dev/role"
	AnnotationMemberLSN     = "chartpilot.dev/lsn"
	// AnnotationMemberTimeline is the member's timeline: positions compare
	// within a timeline, and a newer timeline wins over any position on an
	// older one.
	AnnotationMemberTimeline = "chartpilot.dev/timeline"
	// AnnotationSynchronousStandby, on the primary's member Lease, names
	// the standby whose flush acknowledges commits: after the primary is
	// lost, no other promotes without it taking part in the election.
	AnnotationSynchronousStandby = "chartpilot.dev/synchronous"
	// AnnotationMemberSettled says the member's position did not move
	// since its previous report: a standby replaying its own WAL after a
	// restart is not compared until it has finished.
	AnnotationMemberSettled = "chartpilot.dev/settled"
	// AnnotationMemberArchive is the member's WAL archiving, as its
	// server's pg_stat_archiver and archive_status say (JSON: the last
	// archived file and when, failures since the server started, the last
	// failed file and when, files waiting); absent when the server does
	// not archive.
	AnnotationMemberArchive = "chartpilot.dev/archive"
	// AnnotationPromotedFrom and AnnotationPromotedLagBytes, on the
	// primary's Lease, are written by a member that promoted: the member
	// it took over from, and how far behind that one it was.
	AnnotationPromotedFrom     = "chartpilot.dev/previous"
	AnnotationPromotedLagBytes = "chartpilot.dev/lag-bytes"
	// LabelMemberRole is a pod's role (primary or standby), which the
	// Services select on; LabelCluster names the cluster it belongs to.
	LabelMemberRole = "chartpilot.dev/role"
	LabelCluster    = "chartpilot.dev/cluster"
)

// Labels and annotations of backups and restores.
const (
	// LabelBackup marks a backup Job and its pod with the Backup.
	LabelBackup = "chartpilot.dev/backup"
	// LabelComponent says which part of chartpilot's work an object is
	// (backup, restore, major-upgrade).
	LabelComponent = "app.kubernetes.io/component"
	// LabelScheduledBy names the resource whose schedule made a Backup;
	// AnnotationScheduledAt is the schedule time (RFC 3339) it was made for.
	LabelScheduledBy      = "chartpilot.dev/scheduled-by"
	AnnotationScheduledAt = "chartpilot.dev/scheduled-at"
	// LabelBeforeMajor marks the Backup taken before a PostgreSQL major
	// upgrade, with the major it upgrades to.
	LabelBeforeMajor = "chartpilot.dev/before-major"
	// LabelMajorUpgrade marks a major upgrade Job with the Postgres it is for.
	LabelMajorUpgrade = "chartpilot.dev/major-upgrade"
	// LabelRestore marks a restore Job with the Postgres it restores into.
	LabelRestore = "chartpilot.dev/restore"
	// LabelRestoreInto marks a passthrough restore's Job and claim with the
	// resource restored into.
	LabelRestoreInto = "chartpilot.dev/restore-into"
	// AnnotationRestoreFor, on a passthrough restore's claim, is the UID of
	// the resource it was made for (a claim without it is never written
	// to); AnnotationRestoreBackup and AnnotationRestoreSHA256, on its Job,
	// the Backup it restores and that Backup's SHA-256.
	AnnotationRestoreFor    = "chartpilot.dev/restore-for"
	AnnotationRestoreBackup = "chartpilot.dev/restore-backup"
	AnnotationRestoreSHA256 = "chartpilot.dev/restore-sha256"
)
