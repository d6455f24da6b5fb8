package agentargs

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Subcommands of `chartpilot backup`.
const (
	Run     = "run"
	Restore = "restore"
	Verify  = "verify"
)

// CompressionZstd is the agent's default compression.
const CompressionZstd = "zstd"

// Backup is the command line of `chartpilot backup run|restore|verify`:
// Args writes it (the Jobs), Register parses it (the agent).
type Backup struct {
	// Sub is the subcommand (the first word, not a flag).
	Sub string
	// Location is the backup's key prefix in the store.
	Location string
	// ManifestFile also gets the manifest (a Job's /dev/termination-log).
	ManifestFile string
	// Labels are key=value, stored in the manifest (run).
	Labels []string
	// Compression (run): zstd or none.
	Compression string
	// KeepCount and KeepMaxAge prune the series after a backup (run).
	KeepCount  int
	KeepMaxAge time.Duration
	Store      Store
	// ExpectSHA256 and ExpectSize are what the Backup recorded (restore,
	// verify).
	ExpectSHA256 string
	ExpectSize   int64
	// Postgres: a full backup of the PostgreSQL server libpq's
	// environment reaches; Scratch: a drill into a server of its own;
	// PrivilegedRoles: a restore also restores privileged attributes.
	Postgres, Scratch, PrivilegedRoles bool
	// Recipient (run) and IdentityFile (restore, verify): age keys given
	// on the command line rather than in EnvAgeKey.
	Recipient, IdentityFile string
	// Command is what runs after --: the command backed up or restored
	// into.
	Command []string
}

// Args is b as the agent's arguments, after `chartpilot backup`.
func (b Backup) Args() []string {
	out := []string{b.Sub, "--location", b.Location}
	add := func(flag, v string) {
		if v != "" {
			out = append(out, flag, v)
		}
	}
	add("--manifest-file", b.ManifestFile)
	for _, l := range b.Labels {
		out = append(out, "--label", l)
	}
	add("--compression", b.Compression)
	if b.KeepCount > 0 {
		out = append(out, "--keep-count", strconv.Itoa(b.KeepCount))
	}
	if b.KeepMaxAge > 0 {
		out = append(out, "--keep-max-age", b.KeepMaxAge.String())
	}
	add("--recipient", b.Recipient)
	add("--identity-file", b.IdentityFile)
	out = append(out, b.Store.Args()...)
	add("--expect-sha256", b.ExpectSHA256)
	if b.ExpectSize > 0 {
		out = append(out, "--expect-size", strconv.FormatInt(b.ExpectSize, 10))
	}
	if b.Postgres {
		out = append(out, "--postgres")
	}
	if b.PrivilegedRoles {
		out = append(out, "--privileged-roles")
	}
	if b.Scratch {
		out = append(out, "--scratch")
	}
	if len(b.Command) > 0 {
		out = append(append(out, "--"), b.Command...)
	}
	return out
}

// Register makes fs parse the flags of `chartpilot backup SUB` into b
// (Sub and Command are the caller's: the first word and what follows --).
func (b *Backup) Register(fs *flag.FlagSet) {
	fs.StringVar(&b.Location, "location", "", "key prefix of the backup in the store, e.g. orders/2026-11-30T120000Z (required)")
	b.Store.Register(fs)
	fs.StringVar(&b.Recipient, "recipient", "", "run: age X25519 public key (age1…) to encrypt for; empty: not encrypted")
	fs.StringVar(&b.Compression, "compression", CompressionZstd, "run: zstd or none")
	fs.StringVar(&b.IdentityFile, "identity-file", "", "restore: file holding the age X25519 secret key of an encrypted backup")
	fs.IntVar(&b.KeepCount, "keep-count", 0, "run: after the backup, prune the series (the location's parent) to this many backups (0: no count rule)")
	fs.DurationVar(&b.KeepMaxAge, "keep-max-age", 0, "run: after the backup, prune backups of the series older than this (0: no age rule); the newest is always kept")
	fs.StringVar(&b.ExpectSHA256, "expect-sha256", "", "restore, verify: the SHA-256 the backup was recorded with (its Backup's status); a backup in the store that differs is refused before it is downloaded")
	fs.Int64Var(&b.ExpectSize, "expect-size", 0, "restore, verify: the size in bytes the backup was recorded with; no more than this is downloaded")
	fs.BoolVar(&b.Postgres, "postgres", false, "run: back up everything the PostgreSQL server libpq's environment (PGHOST…) reaches holds, its roles and every database, instead of a command's output; restore: restore such a backup (or one database's pg_dump -Fc) into that server")
	fs.BoolVar(&b.PrivilegedRoles, "privileged-roles", false, "restore --postgres: also restore SUPERUSER, REPLICATION and BYPASSRLS, and memberships in superusers and in pg_read_server_files, pg_write_server_files and pg_execute_server_program (without it, only the target's own roles have them)")
	fs.BoolVar(&b.Scratch, "scratch", false, "verify: restore the backup whole, roles included, into a server of the drill's own (initdb and postgres from PATH or /usr/lib/postgresql, in $CHARTPILOT_STAGE_DIR or the temporary directory), not into the server libpq's environment reaches")
	fs.StringVar(&b.ManifestFile, "manifest-file", "", "also write the manifest to this file (a Job's /dev/termination-log, which its pod's status shows)")
	fs.Func("label", "run: key=value stored in the manifest (repeatable)", func(v string) error {
		if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
			return fmt.Errorf("%q is not key=value", v)
		}
		b.Labels = append(b.Labels, v)
		return nil
	})
}

// LabelMap is Labels as a map (the last of a key wins).
func (b Backup) LabelMap() map[string]string {
	m := map[string]string{}
	for _, l := range b.Labels {
		k, v, _ := strings.Cut(l, "=")
		m[k] = v
	}
	return m
}
