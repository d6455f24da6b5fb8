package agentargs

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// Commands of the WAL archive (`chartpilot wal-push` and the others).
const (
	WALPush    = "wal-push"
	WALFetch   = "wal-fetch"
	BaseBackup = "base-backup"
	WALServe   = "wal-serve"
	WALStatus  = "wal-status"
	WALPrune   = "wal-prune"
	Recover    = "recover"
)

// DefaultWALSegmentSize is PostgreSQL's default wal_segment_size.
const DefaultWALSegmentSize = 16 << 20

// DefaultWALParallel is how many segments wal-push uploads at once.
const DefaultWALParallel = 4

// WAL is the command line of the WAL archive's commands: Args writes it
// (Jobs and the instance manager), Register parses it (the agent). The
// chart writes the same flags in its templates; its test runs them.
type WAL struct {
	// Command is the command's name (the first word, not a flag).
	Command string
	Store   Store
	// Prefix is the archive's key prefix in the store.
	Prefix      string
	SegmentSize int64
	Parallel    int
	Compression string
	// DataDir: recover's target, wal-serve's server data directory.
	DataDir string
	// Base, the targets, StagingDir and PostgresOptions are recover's.
	Base, TargetTime, TargetLSN, TargetXID, StagingDir string
	PostgresOptions                                    []string
	// Via is the WAL service's socket (wal-push, wal-fetch); Socket the
	// one wal-serve serves on.
	Via, Socket string
	// RecoveryWindow is what wal-prune keeps (such as 7d).
	RecoveryWindow string
	// NewCluster is recover's: the name of the cluster's primary Lease;
	// set, the recovery makes the first data of a new cluster (see
	// wal.NewCluster), and is skipped once the Lease was ever held.
	NewCluster string
	// Location is base-backup's (below PREFIX/base/; default a name of
	// the time); ManifestFile also gets its manifest (a Job's
	// /dev/termination-log).
	Location, ManifestFile string
	// Args are the positional arguments (wal-push PATH, wal-fetch NAME
	// PATH).
	Args []string
}

// Line is w as the agent's arguments, the command first.
func (w WAL) Line() []string {
	out := []string{w.Command}
	add := func(flag, v string) {
		if v != "" {
			out = append(out, flag, v)
		}
	}
	out = append(out, w.Store.Args()...)
	add("--prefix", w.Prefix)
	if w.SegmentSize != 0 && w.SegmentSize != DefaultWALSegmentSize {
		out = append(out, "--segment-size", strconv.FormatInt(w.SegmentSize, 10))
	}
	if w.Parallel != 0 && w.Parallel != DefaultWALParallel {
		out = append(out, "--parallel", strconv.Itoa(w.Parallel))
	}
	if w.Compression != CompressionZstd {
		add("--compression", w.Compression)
	}
	add("--data-dir", w.DataDir)
	add("--base", w.Base)
	add("--target-time", w.TargetTime)
	add("--target-lsn", w.TargetLSN)
	add("--target-xid", w.TargetXID)
	add("--staging-dir", w.StagingDir)
	for _, o := range w.PostgresOptions {
		out = append(out, "--postgres-option", o)
	}
	add("--via", w.Via)
	add("--socket", w.Socket)
	add("--recovery-window", w.RecoveryWindow)
	add("--new-cluster", w.NewCluster)
	add("--location", w.Location)
	add("--manifest-file", w.ManifestFile)
	return append(out, w.Args...)
}

// Register makes fs parse the flags of the WAL commands into w (Command
// and Args are the caller's: the first word and what fs leaves).
func (w *WAL) Register(fs *flag.FlagSet) {
	w.Store.Register(fs)
	fs.StringVar(&w.Prefix, "prefix", "", "the archive's key prefix in the store, e.g. shop/orders (required)")
	fs.Int64Var(&w.SegmentSize, "segment-size", DefaultWALSegmentSize, "the server's wal_segment_size in bytes")
	fs.IntVar(&w.Parallel, "parallel", DefaultWALParallel, "wal-push: segments uploaded at once (the one asked for and the next ones ready)")
	fs.StringVar(&w.Compression, "compression", CompressionZstd, "wal-push, base-backup: zstd or none")
	fs.StringVar(&w.DataDir, "data-dir", "", "recover: the data directory to restore into (absent or empty); wal-serve: the server's, under which requests name files")
	fs.StringVar(&w.Base, "base", "", "recover: the base backup's location (default: the newest that ends before the target)")
	fs.StringVar(&w.TargetTime, "target-time", "", "recover: stop after the last transaction committed at or before this time (RFC 3339)")
	fs.StringVar(&w.TargetLSN, "target-lsn", "", "recover: stop at this LSN (such as 0/3000028)")
	fs.StringVar(&w.TargetXID, "target-xid", "", "recover: stop after this transaction")
	fs.StringVar(&w.StagingDir, "staging-dir", "", "recover: where the base backup is checked before it is restored (default: beside --data-dir)")
	fs.StringVar(&w.Via, "via", "", "wal-push, wal-fetch: ask the WAL service on this Unix socket (chartpilot wal-serve) instead of the store: no credential or key needed here")
	fs.StringVar(&w.Socket, "socket", "", "wal-serve: the Unix socket to serve on (mode 0600)")
	fs.StringVar(&w.RecoveryWindow, "recovery-window", "", "wal-prune: keep what recovers to any point this far back (such as 7d or 36h)")
	fs.StringVar(&w.NewCluster, "new-cluster", "", "recover: make the first data of a new cluster whose primary holds this Lease (of the pod's namespace): skipped once the Lease was ever held or --data-dir holds a cluster; recovered beside --data-dir and moved into place, the superuser POSTGRES_USER given POSTGRES_PASSWORD")
	fs.StringVar(&w.Location, "location", "", "base-backup: where the base backup goes, a name directly below PREFIX/base/ (default: one of the time)")
	fs.StringVar(&w.ManifestFile, "manifest-file", "", "base-backup: also write the manifest to this file; wal-prune: its report, with the window left; recover --new-cluster: its outcome (a Job's or pod's /dev/termination-log)")
	fs.Func("postgres-option", "recover: NAME=VALUE passed to postgres during the replay (repeatable)", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("%q is not NAME=VALUE", v)
		}
		w.PostgresOptions = append(w.PostgresOptions, v)
		return nil
	})
}
