package backup

import (
	"time"

	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// Deps is what the backup controllers (stores, backups, schedules,
// restores) are built from: the operator wires one value into each.
type Deps struct {
	Client client.Client
	// Reader reads Secrets, Namespaces, claims and pods from the API
	// server (not cached: a store's Secret is read once per check).
	Reader   client.Reader
	Recorder record.EventRecorder
	// Identity creates the Jobs as the target's identity (nil: as the
	// manager).
	Identity *Identity
	// Image is chartpilot's image: an init container copies the agent from
	// it into a Job's pod, whose container is the database's own image
	// (postgres:<version> for a Postgres: client tools of its major); Jobs
	// that need no database tools run it alone.
	Image string
	// PostgresImage is the repository of the PostgreSQL images the Jobs
	// of a Postgres run, REPOSITORY:<spec.version> ("postgres" when empty).
	PostgresImage string
	// Deadline bounds a Job's run; DefaultDeadline when zero.
	Deadline time.Duration
	// Stores runs the store helper, which checks remote stores and reads a
	// backup's manifest from them.
	Stores *backup.StoreHelper
	// Endpoints are the URLs a namespaced BackupStore's endpoint (and a
	// GCS key's token endpoint) must lie within, compared as parsed
	// scheme, host, port and path (the operator's --backup-store-endpoints):
	// the operator connects to the endpoint, so a tenant may only point it
	// where the admin allows. A ClusterBackupStore is the admin's own and
	// may name any endpoint; an empty endpoint (AWS) is always allowed.
	Endpoints []string
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
	// Now is the clock (tests).
	Now func() time.Time
}
