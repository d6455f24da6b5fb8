//go:build !manager

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/agent/instance"
	"github.com/chartpilot/chartpilot/internal/agent/wal"
	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/backup"
)

const walUsage = `Usage:
  chartpilot wal-push  [flags] PATH        archive_command: archive the WAL file at PATH (%p)
  chartpilot wal-fetch [flags] NAME PATH   restore_command: fetch WAL file NAME (%f) to PATH (%p);
                                           exit code 1 when the archive has no such file
  chartpilot wal-serve [flags] --socket S --data-dir D
                                           serve wal-push and wal-fetch --via S for the server of D:
                                           the store's credentials and the key stay in this process
  chartpilot base-backup [flags]           a physical base backup (pg_basebackup) of the server
                                           libpq's environment (PGHOST…) reaches, stored beside the WAL
  chartpilot wal-status [flags]            what the archive can recover to: the first and last point,
                                           its base backups and WAL files (JSON)
  chartpilot wal-prune [flags] --recovery-window 7d
                                           delete the base backups and WAL no point of the window needs
  chartpilot recover [flags]               restore a base backup into --data-dir and replay the
                                           archived WAL to a target, then promote

Every command names the store as chartpilot backup does (--store, --s3-…)
and the archive's --prefix in it; credentials and keys come from the
environment (CHARTPILOT_S3_ACCESS_KEY_ID…, CHARTPILOT_AGE_KEY), never from
flags. What is pushed is compressed (zstd), encrypted for CHARTPILOT_AGE_KEY
when it is set, and checksummed; nothing archived is ever overwritten.

Flags:
`

// walCommand is wal-push, wal-fetch, base-backup and recover.
func walCommand(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	if helpRequested(args) {
		return printHelp(stdout, walUsage)
	}
	fs := flag.NewFlagSet("chartpilot "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { io.WriteString(stderr, walUsage); fs.PrintDefaults() }
	var w agentargs.WAL
	w.Register(fs)
	prefix, segSize, parallel, compression, dataDir := &w.Prefix, &w.SegmentSize, &w.Parallel, &w.Compression, &w.DataDir
	base, targetTime, targetLSN, targetXID, stagingDir := &w.Base, &w.TargetTime, &w.TargetLSN, &w.TargetXID, &w.StagingDir
	via, socket, window := &w.Via, &w.Socket, &w.RecoveryWindow
	if err := fs.Parse(args); err != nil {
		return err
	}
	sf := storeFlags{w.Store}
	if *via != "" {
		return askService(ctx, name, *via, fs.Args())
	}
	if *prefix == "" {
		return errors.New("--prefix is required")
	}
	b, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	a := &wal.Archive{Bucket: b, Prefix: *prefix, Compression: *compression, SegmentSize: *segSize}
	if a.Recipient, err = recipientFromEnv(); err != nil {
		return err
	}
	if k := strings.TrimSpace(os.Getenv(agentargs.EnvAgeKey)); strings.HasPrefix(k, "AGE-SECRET-KEY-1") {
		a.Identity = k
	}
	rest := fs.Args()
	switch name {
	case "wal-push":
		if len(rest) != 1 {
			return errors.New("usage: chartpilot wal-push [flags] PATH")
		}
		return a.PushReady(ctx, rest[0], *parallel)
	case "wal-fetch":
		if len(rest) != 2 {
			return errors.New("usage: chartpilot wal-fetch [flags] NAME PATH")
		}
		return a.Fetch(ctx, rest[0], rest[1])
	case "base-backup":
		m, err := a.BaseBackup(ctx, nil, time.Now(), w.Location)
		if err != nil {
			return err
		}
		if w.ManifestFile != "" {
			b, err := json.Marshal(m)
			if err != nil {
				return err
			}
			if err := os.WriteFile(w.ManifestFile, b, 0o644); err != nil {
				return fmt.Errorf("writing the manifest to %s: %w", w.ManifestFile, err)
			}
		}
		return json.NewEncoder(stdout).Encode(m)
	case "wal-serve":
		return serveWAL(ctx, &wal.Service{Archive: a, DataDir: *dataDir, Parallel: *parallel,
			Log: func(op, name string, err error) { fmt.Fprintf(stderr, "%s %s: %v\n", op, name, err) }}, *socket, stderr)
	case "wal-status":
		w, err := a.Window(ctx)
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(w)
	case "wal-prune":
		return prune(ctx, a, *window, w.ManifestFile, stderr)
	}
	// recover
	var t wal.Target
	if *targetTime != "" {
		if t.Time, err = time.Parse(time.RFC3339Nano, *targetTime); err != nil {
			return fmt.Errorf("--target-time %q: not an RFC 3339 time (2026-12-04T10:00:00Z)", *targetTime)
		}
	}
	t.LSN, t.XID = *targetLSN, *targetXID
	fetch := append(append([]string{"wal-fetch"}, sf.args()...), "--prefix="+*prefix, fmt.Sprintf("--segment-size=%d", *segSize))
	rc := recovery{target: t, base: *base, dataDir: *dataDir, stagingDir: *stagingDir, fetch: fetch, options: w.PostgresOptions}
	if w.NewCluster != "" {
		return recoverNewCluster(ctx, a, rc, w.NewCluster, w.ManifestFile, stderr)
	}
	_, _, err = recoverTo(ctx, a, rc, stderr)
	return err
}

// PruneReport is what wal-prune reports (to --manifest-file): how much it
// deleted (the names go to stderr), and what the archive can recover to
// afterwards. Small: a pod's termination message is cut short.
type PruneReport struct {
	PrunedBases int         `json:"prunedBases"`
	PrunedFiles int         `json:"prunedFiles"`
	Window      *wal.Window `json:"window"`
}

// prune deletes what no point of the recovery window needs.
func prune(ctx context.Context, a *wal.Archive, window, reportFile string, stderr io.Writer) error {
	d, err := parseWindow(window)
	if err != nil {
		return fmt.Errorf("--recovery-window: %w", err)
	}
	p, err := a.Prune(ctx, d, time.Now())
	if p != nil {
		for _, b := range p.Bases {
			fmt.Fprintf(stderr, "pruned base backup %s\n", b)
		}
		fmt.Fprintf(stderr, "pruned %d WAL files\n", p.Files)
	}
	if err != nil {
		return err
	}
	if reportFile == "" {
		return nil
	}
	w, err := a.Window(ctx)
	if err != nil {
		return err
	}
	rep := PruneReport{PrunedBases: len(p.Bases), PrunedFiles: p.Files, Window: w}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return os.WriteFile(reportFile, b, 0o644)
}

// recovery is what `chartpilot recover` was asked.
type recovery struct {
	target              wal.Target
	base                string
	dataDir, stagingDir string
	// fetch is this binary's restore_command words (wal-fetch and the
	// store's flags) before %f %p.
	fetch   []string
	options []string
}

// recoverTo restores a base backup of a into rc.dataDir and replays the
// archived WAL to rc.target, then promotes.
// It returns the plan it followed and the server's log.
func recoverTo(ctx context.Context, a *wal.Archive, rc recovery, stderr io.Writer) (*wal.Plan, string, error) {
	if rc.dataDir == "" {
		return nil, "", errors.New("--data-dir is required")
	}
	t := rc.target
	plan, err := a.Plan(ctx, t, rc.base)
	if err != nil {
		return nil, "", err
	}
	fmt.Fprintf(stderr, "recovering to %s from base backup %s (timeline %d, %s), the archive's timeline %d up to %s\n",
		t, plan.Base, plan.Start.TLI, plan.Manifest.Labels[wal.LabelStopTime], plan.Timeline, plan.Last)
	if plan.Gap != "" {
		fmt.Fprintf(stderr, "the archive has a gap at segment %s: recovery cannot pass it\n", plan.Gap)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	var quoted []string
	for _, w := range append([]string{self}, rc.fetch...) {
		quoted = append(quoted, shellQuote(w))
	}
	restoreCommand := strings.Join(quoted, " ") + " %f %p"
	staging := rc.stagingDir
	if staging == "" {
		staging = filepath.Dir(filepath.Clean(rc.dataDir))
	}
	if err := a.Prepare(ctx, plan, rc.dataDir, staging, restoreCommand, t, backup.Expect{}); err != nil {
		return nil, "", err
	}
	socketDir, err := os.MkdirTemp("", "chartpilot-recover-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(socketDir)
	logPath := filepath.Join(staging, "chartpilot-recover.log")
	if err := wal.Replay(ctx, rc.dataDir, socketDir, logPath, rc.options); err != nil {
		if plan.Gap != "" {
			return nil, "", fmt.Errorf("the archive has a gap at segment %s (missing while %s, newer, is there): %w", plan.Gap, plan.Last, err)
		}
		return nil, "", err
	}
	fmt.Fprintf(stderr, "recovered to %s and promoted; the server's messages are in %s\n", t, logPath)
	return plan, logPath, nil
}

// recoverNewCluster is `recover --new-cluster LEASE`: the first data of a
// cluster that never had a primary, recovered beside --data-dir and moved
// into place for the instance manager to lead with. Its outcome goes to
// outcomeFile (the pod's termination message), a failure's too.
func recoverNewCluster(ctx context.Context, a *wal.Archive, rc recovery, lease, outcomeFile string, stderr io.Writer) error {
	if rc.dataDir == "" {
		return errors.New("--data-dir is required")
	}
	n := wal.NewCluster{DataDir: rc.dataDir, Marker: instance.MovedMarker(rc.dataDir), EverLed: leaseEverHeld(lease),
		User: os.Getenv("POSTGRES_USER"), Password: os.Getenv("POSTGRES_PASSWORD")}
	out := wal.Outcome{Target: rc.target.String()}
	err := func() error {
		why, err := n.Skip(ctx)
		if err != nil || why != "" {
			out.Phase, out.Message = wal.OutcomeSkipped, why
			return err
		}
		if err := os.RemoveAll(n.Work()); err != nil {
			return err
		}
		rc.dataDir = n.Work()
		if rc.stagingDir == "" {
			rc.stagingDir = filepath.Dir(filepath.Clean(n.DataDir))
		}
		plan, logPath, err := recoverTo(ctx, a, rc, stderr)
		if err != nil {
			return err
		}
		out.Base, out.LastTransactionTime, out.Timeline = plan.Base, wal.LastTransaction(logPath), wal.Timeline(n.Work())
		if err := n.Finish(ctx); err != nil {
			return err
		}
		out.Phase = wal.OutcomeCompleted
		out.Message = fmt.Sprintf("recovered to %s from base backup %s; promoted on timeline %d", out.Target, plan.Base, out.Timeline)
		if out.LastTransactionTime != "" {
			out.Message += "; the last transaction replayed committed at " + out.LastTransactionTime
		}
		return nil
	}()
	if err != nil {
		out.Phase, out.Message = wal.OutcomeFailed, err.Error()
	}
	fmt.Fprintln(stderr, out.Message)
	if outcomeFile != "" {
		if len(out.Message) > 2048 {
			out.Message = out.Message[:2048] + "…"
		}
		b, _ := json.Marshal(out)
		if werr := os.WriteFile(outcomeFile, b, 0o644); werr != nil {
			fmt.Fprintf(stderr, "writing the outcome to %s: %v\n", outcomeFile, werr)
		}
	}
	return err
}

// leaseEverHeld reports whether the Lease lease of the pod's namespace
// was ever held (through the pod's service account).
func leaseEverHeld(lease string) func(ctx context.Context) (bool, string, error) {
	return func(ctx context.Context) (bool, string, error) {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return false, "", err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return false, "", err
		}
		ns := os.Getenv("POD_NAMESPACE")
		if ns == "" {
			b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
			if err != nil {
				return false, "", errors.New("POD_NAMESPACE is not set and the service account names no namespace")
			}
			ns = strings.TrimSpace(string(b))
		}
		l, err := cs.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "", nil
		}
		if err != nil {
			return false, "", err
		}
		if h := l.Spec.HolderIdentity; (h != nil && *h != "") || l.Spec.AcquireTime != nil || ptr.Deref(l.Spec.LeaseTransitions, 0) > 0 {
			return true, "Lease " + lease + " was held", nil
		}
		return false, "", nil
	}
}

// askService is wal-push or wal-fetch through the WAL service at socket.
func askService(ctx context.Context, name, socket string, rest []string) error {
	switch {
	case name == "wal-push" && len(rest) == 1:
		return wal.Ask(ctx, socket, wal.Request{Op: "push", Path: rest[0]})
	case name == "wal-fetch" && len(rest) == 2:
		return wal.Ask(ctx, socket, wal.Request{Op: "fetch", Name: rest[0], Path: rest[1]})
	case name == "wal-push" || name == "wal-fetch":
		return fmt.Errorf("usage: chartpilot %s --via SOCKET %s", name, map[string]string{"wal-push": "PATH", "wal-fetch": "NAME PATH"}[name])
	}
	return fmt.Errorf("--via is for wal-push and wal-fetch, not %s", name)
}

// serveWAL runs svc on a Unix socket only this user may connect to.
func serveWAL(ctx context.Context, svc *wal.Service, socket string, stderr io.Writer) error {
	if socket == "" || svc.DataDir == "" {
		return errors.New("wal-serve: --socket and --data-dir are required")
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the old socket %s: %w", socket, err)
	}
	old := syscall.Umask(0o077)
	l, err := net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		return err
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		l.Close()
		return err
	}
	fmt.Fprintf(stderr, "serving wal-push and wal-fetch for %s on %s\n", svc.DataDir, socket)
	return svc.Serve(ctx, l)
}

// shellQuote quotes s for sh (restore_command runs through it).
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=/.:,@+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// parseWindow reads a duration that may be in days ("7d") as well as
// Go's units ("36h").
func parseWindow(s string) (time.Duration, error) {
	var d time.Duration
	var err error
	if n, ok := strings.CutSuffix(s, "d"); ok {
		var days int
		if _, err = fmt.Sscanf(n, "%d", &days); err == nil && fmt.Sprint(days) == n {
			d = time.Duration(days) * 24 * time.Hour
		} else {
			err = errors.New("not a number of days")
		}
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration (7d, 36h)", s)
	}
	return d, nil
}
