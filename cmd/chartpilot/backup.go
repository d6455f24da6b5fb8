//go:build !manager

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"filippo.io/age"
	"gocloud.dev/blob"
	"golang.org/x/sys/unix"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/agent/pgfull"
	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/backup"
)

const backupUsage = `Usage:
  chartpilot backup run     [flags] -- COMMAND [ARGS...]   back up COMMAND's standard output (pg_dump -Fc, say)
  chartpilot backup restore [flags] -- COMMAND [ARGS...]   restore into COMMAND's standard input (pg_restore -d DB, say)
  chartpilot backup verify  [flags]                        restore drill: restore into a throwaway database of the
                                                           server libpq's environment (PGHOST…) reaches, count its
                                                           tables, drop it

The stream is compressed (zstd), encrypted on this side when a recipient is
given (age X25519), checksummed (SHA-256) and stored at --location with a
manifest beside it; a restore checks the checksum before COMMAND starts.
The manifest is printed on standard output as JSON.

Credentials come from the environment, never from flags:
CHARTPILOT_S3_ACCESS_KEY_ID and CHARTPILOT_S3_SECRET_ACCESS_KEY for S3,
CHARTPILOT_AZURE_ACCOUNT_KEY for Azure, CHARTPILOT_GCS_SERVICE_ACCOUNT_KEY
(a service account's JSON key; none against an emulator) for GCS. Without
--recipient, run encrypts for CHARTPILOT_AGE_KEY when it is set: an age
X25519 recipient (age1…) or identity (AGE-SECRET-KEY-1…, its recipient).

Flags:
`

// backupCommand is `chartpilot backup run|restore`.
func backupCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if helpRequested(args) {
		return printHelp(stdout, backupUsage)
	}
	if len(args) == 0 || (args[0] != "run" && args[0] != "restore" && args[0] != "verify") {
		fmt.Fprint(stderr, backupUsage)
		return errors.New("a subcommand is required: run, restore or verify")
	}
	sub := args[0]
	fs := flag.NewFlagSet("chartpilot backup "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, backupUsage); fs.PrintDefaults() }
	a := agentargs.Backup{Sub: sub}
	a.Register(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	command := fs.Args()
	location, recipient, postgres, manifestFile := &a.Location, &a.Recipient, &a.Postgres, &a.ManifestFile
	keep, want := backup.Retention{Count: a.KeepCount, MaxAge: a.KeepMaxAge}, backup.Expect{SHA256: a.ExpectSHA256, Size: a.ExpectSize}
	switch {
	case *location == "":
		return errors.New("--location is required")
	case *postgres && (sub == "verify" || len(command) > 0):
		return errors.New("--postgres backs up or restores a PostgreSQL server itself: give no command after --, and verify reads either kind of backup without it")
	case len(command) == 0 && sub != "verify" && !*postgres:
		return fmt.Errorf("the command to %s is required after -- (or --postgres for a PostgreSQL server)", map[string]string{"run": "back up", "restore": "restore into"}[sub])
	}
	b, err := (&storeFlags{a.Store}).open(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	var m *backup.Manifest
	var report any
	if sub == "run" && *recipient == "" {
		r, err := recipientFromEnv()
		if err != nil {
			return err
		}
		*recipient = r
	}
	if sub == "run" {
		o := backup.Options{Compression: a.Compression, Recipient: *recipient, Labels: a.LabelMap()}
		if *postgres {
			m, err = backupProduce(ctx, b, *location, o, func(ctx context.Context, w io.Writer) error { return pgfull.Dump(ctx, w, nil) })
		} else {
			m, err = backupRun(ctx, b, *location, command, o, stderr)
		}
		if err == nil && (keep.Count != 0 || keep.MaxAge != 0) {
			// Only after a success: a failed backup never costs a good one.
			pruned, perr := backup.Prune(ctx, b, path.Dir(strings.TrimSuffix(*location, "/")), keep, time.Now())
			for _, p := range pruned {
				fmt.Fprintf(stderr, "pruned %s\n", p)
			}
			if perr != nil {
				fmt.Fprintf(stderr, "pruning: %v (the backup is stored)\n", perr)
			}
		}
	} else {
		identity := ""
		if a.IdentityFile != "" {
			data, err := os.ReadFile(a.IdentityFile)
			if err != nil {
				return fmt.Errorf("--identity-file: %w", err)
			}
			identity = strings.TrimSpace(string(data))
		} else if k := strings.TrimSpace(os.Getenv(agentargs.EnvAgeKey)); strings.HasPrefix(k, "AGE-SECRET-KEY-1") {
			identity = k
		}
		if sub == "verify" {
			var rep *verifyReport
			if rep, err = backupVerify(ctx, b, *location, identity, want, a.Scratch); err == nil {
				report = rep
			}
		} else if *postgres {
			m, err = backupConsume(ctx, b, *location, identity, want, func(ctx context.Context, r io.Reader) error {
				return restorePostgres(ctx, r, a.PrivilegedRoles, stderr)
			})
		} else {
			m, err = backupRestore(ctx, b, *location, identity, want, command, stderr)
		}
	}
	if err != nil {
		return err
	}
	if report == nil {
		report = m
	}
	if *manifestFile != "" {
		data, err := json.Marshal(report)
		if err != nil {
			return err
		}
		if err := os.WriteFile(*manifestFile, data, 0o644); err != nil {
			return fmt.Errorf("--manifest-file: %w", err)
		}
	}
	return json.NewEncoder(stdout).Encode(report)
}

// storeFlags are the flags that name a store (agentargs.Store, which
// the Jobs' builders write); its credentials come from the environment.
type storeFlags struct{ agentargs.Store }

func (f *storeFlags) register(fs *flag.FlagSet) { f.Store.Register(fs) }

// args are the store flags given, as flags again (a command line that
// opens the same store: credentials stay in the environment).
func (f *storeFlags) args() []string { return f.Store.Args() }

func (f *storeFlags) open(ctx context.Context) (*blob.Bucket, error) {
	s := f.Store
	return openStore(ctx, s.Kind,
		backup.S3{Endpoint: s.S3Endpoint, Bucket: s.S3Bucket, Prefix: s.S3Prefix, Region: s.S3Region, ForcePathStyle: s.S3ForcePathStyle},
		backup.Azure{Endpoint: s.AzureEndpoint, AccountName: s.AzureAccount, Container: s.AzureContainer, Prefix: s.AzurePrefix},
		backup.GCS{Endpoint: s.GCSEndpoint, Bucket: s.GCSBucket, Prefix: s.GCSPrefix}, s.S3CAFile, s.VolumePath)
}

func openStore(ctx context.Context, kind string, s3 backup.S3, az backup.Azure, gcs backup.GCS, caFile, volumePath string) (*blob.Bucket, error) {
	switch kind {
	case "gcs":
		gcs.ServiceAccountKey = os.Getenv(agentargs.EnvGCSServiceAccountKey)
		// The agent runs in the resource's own namespace, as its Job's
		// ServiceAccount: a key's token endpoint is reached with no more
		// than the tenant's own rights. The key's shape is still checked.
		if k, err := backup.ParseGCSKey(gcs.ServiceAccountKey); err == nil && gcs.ServiceAccountKey != "" {
			gcs.AllowedTokenURLs = []string{k.TokenURL()}
		}
		return blobstore.OpenGCS(ctx, gcs)
	case "azure":
		az.AccountKey = os.Getenv(agentargs.EnvAzureAccountKey)
		return blobstore.OpenAzure(ctx, az)
	case "s3":
		s3.AccessKeyID = os.Getenv(agentargs.EnvS3AccessKeyID)
		s3.SecretAccessKey = os.Getenv(agentargs.EnvS3SecretAccessKey)
		if caFile != "" {
			ca, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("--s3-ca-file: %w", err)
			}
			s3.CABundle = ca
		}
		return blobstore.OpenS3(ctx, s3)
	case "volume":
		if volumePath == "" {
			return nil, errors.New("--volume-path is required with --store volume")
		}
		return backup.OpenDir(volumePath)
	}
	return nil, fmt.Errorf("--store %q: must be s3, gcs, azure or volume", kind)
}

// backupRun stores command's standard output. A command that fails, even
// after writing, stores nothing: its failure reaches the upload as an
// error, which aborts it.
func backupRun(ctx context.Context, b *blob.Bucket, location string, command []string, o backup.Options, stderr io.Writer) (*backup.Manifest, error) {
	return backupProduce(ctx, b, location, o, func(ctx context.Context, w io.Writer) error {
		cmd := exec.CommandContext(ctx, command[0], command[1:]...)
		cmd.Stdout, cmd.Stderr = w, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s failed: %w", command[0], err)
		}
		return nil
	})
}

// backupProduce stores what produce writes. A producer that fails, even
// after the upload began, fails the backup: no manifest is written.
func backupProduce(ctx context.Context, b *blob.Bucket, location string, o backup.Options, produce func(context.Context, io.Writer) error) (*backup.Manifest, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := produce(ctx, pw)
		_ = pw.CloseWithError(err) // nil: end of stream
		produced <- err
	}()
	m, err := backup.Write(ctx, b, location, pr, o)
	if err != nil {
		_ = pr.CloseWithError(err)
		cancel()
		if perr := <-produced; perr != nil && !errors.Is(err, perr) {
			return nil, fmt.Errorf("%w (the dump stopped: %v)", err, perr)
		}
		return nil, err
	}
	if err := <-produced; err != nil {
		return nil, err
	}
	return m, nil
}

// backupRestore feeds the verified stream to command's standard input;
// command does not start when the backup does not open.
func backupRestore(ctx context.Context, b *blob.Bucket, location, identity string, want backup.Expect, command []string, stderr io.Writer) (*backup.Manifest, error) {
	return backupConsume(ctx, b, location, identity, want, func(ctx context.Context, r io.Reader) error {
		cmd := exec.CommandContext(ctx, command[0], command[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = r, stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s failed: %w", command[0], err)
		}
		return nil
	})
}

// backupConsume opens the backup (its checksum and size checked first)
// and gives the stream to consume; consume does not run when the backup
// does not open.
func backupConsume(ctx context.Context, b *blob.Bucket, location, identity string, want backup.Expect, consume func(context.Context, io.Reader) error) (*backup.Manifest, error) {
	r, m, err := backup.Open(ctx, b, location, identity, "", want)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := consume(ctx, r); err != nil {
		return nil, err
	}
	return m, nil
}

// restorePostgres restores a backup of a PostgreSQL server into the one
// libpq's environment reaches: a full backup (roles and every database),
// or one database's pg_dump -Fc into "postgres", as backups were made
// before they were full.
// SUPERUSER, REPLICATION, BYPASSRLS and memberships that reach the server
// as a superuser are restored only when privileged is set.
func restorePostgres(ctx context.Context, r io.Reader, privileged bool, stderr io.Writer) error {
	br := bufio.NewReader(r)
	head, _ := br.Peek(len(pgfull.Magic))
	if !pgfull.IsFull(head) {
		cmd := exec.CommandContext(ctx, "pg_restore", "--exit-on-error", "--no-owner", "--dbname", "postgres")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = br, stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("pg_restore failed: %w", err)
		}
		return nil
	}
	if _, err := br.Discard(len(pgfull.Magic)); err != nil {
		return err
	}
	skipped, err := pgfull.RestoreWith(ctx, br, nil, pgfull.Options{Privileged: privileged})
	for _, s := range skipped {
		fmt.Fprintln(stderr, s)
	}
	return err
}

// recipientFromEnv is the age recipient of CHARTPILOT_AGE_KEY ("" when it
// is not set): the key itself, or the recipient of an identity. The error
// never shows the key.
func recipientFromEnv() (string, error) {
	key := strings.TrimSpace(os.Getenv(agentargs.EnvAgeKey))
	switch {
	case key == "":
		return "", nil
	case strings.HasPrefix(key, "age1"):
		if _, err := age.ParseX25519Recipient(key); err != nil {
			return "", errors.New("CHARTPILOT_AGE_KEY is not a valid age X25519 recipient")
		}
		return key, nil
	case strings.HasPrefix(key, "AGE-SECRET-KEY-1"):
		id, err := age.ParseX25519Identity(key)
		if err != nil {
			return "", errors.New("CHARTPILOT_AGE_KEY is not a valid age X25519 identity")
		}
		return id.Recipient().String(), nil
	}
	return "", errors.New("CHARTPILOT_AGE_KEY holds neither an age X25519 recipient (age1…) nor an identity (AGE-SECRET-KEY-1…)")
}

// verifyReport is what a restore drill found: the backup's manifest and
// the tables the restored database has.
type verifyReport struct {
	backup.Manifest
	Tables int `json:"tables"`
}

// backupVerify restores the backup into throwaway databases of the
// server the libpq environment names (createdb, pg_restore, psql and
// dropdb from PATH): each database of a full backup, or the one database
// of a pg_dump -Fc; counts their tables, and drops them whatever happened.
// With scratch, it restores a full backup whole into a server of its own
// instead (pgfull.DrillScratch), and the server backed up is not reached.
func backupVerify(ctx context.Context, b *blob.Bucket, location, identity string, want backup.Expect, scratch bool) (*verifyReport, error) {
	prefix := fmt.Sprintf("chartpilot_verify_%d", time.Now().UnixNano())
	tables := 0
	m, err := backupConsume(ctx, b, location, identity, want, func(ctx context.Context, r io.Reader) error {
		br := bufio.NewReader(r)
		head, _ := br.Peek(len(pgfull.Magic))
		full := pgfull.IsFull(head)
		if full {
			if _, err := br.Discard(len(pgfull.Magic)); err != nil {
				return err
			}
		}
		var err error
		switch {
		case scratch:
			// The drill's server runs as this process's user: code that
			// escaped it could not read this process's environment (the
			// store's credentials, the backup's key) through /proc.
			if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
				return fmt.Errorf("making the agent's memory unreadable to the drill's server: %w", err)
			}
			dir := os.Getenv("CHARTPILOT_STAGE_DIR")
			if dir == "" {
				dir = os.TempDir()
			}
			tables, err = pgfull.DrillScratch(ctx, br, full, dir, nil)
		case full:
			tables, err = pgfull.Drill(ctx, br, nil, prefix)
		default:
			tables, err = pgfull.DrillDump(ctx, br, nil, prefix)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &verifyReport{Manifest: *m, Tables: tables}, nil
}

// installAgent copies this executable to DIR/chartpilot: the init
// container of a backup Job whose main container is another image (a
// passthrough kind's) runs it, so that the agent is there.
func installAgent(args []string) error {
	const use = "usage: chartpilot install-agent DIR (copies this binary to DIR/chartpilot)"
	if helpRequested(args) {
		return printHelp(os.Stdout, use)
	}
	if len(args) != 1 {
		return errors.New(use)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(args[0], "chartpilot"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// storeCommand is `chartpilot store`, the store helper the manager runs to
// reach a remote store: one request (JSON, with its credentials) on
// standard input, one answer on standard output.
func storeCommand(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	const use = "usage: chartpilot store < REQUEST (run by the manager, which writes the request)"
	if helpRequested(args) {
		return printHelp(stdout, use)
	}
	if len(args) != 0 {
		return errors.New(use)
	}
	if _, err := sandboxStoreHelper(); err != nil {
		return fmt.Errorf("limiting the store helper's file access: %w", err)
	}
	return blobstore.Serve(ctx, stdin, stdout)
}
