package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/chartpilot/chartpilot/internal/agent/instance"
	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/agentargs"
)

// majorUpgradeCommand moves the data of the PostgreSQL server at
// PGHOST:PGPORT (as PGUSER, PGPASSWORD) to a new data directory of the
// major whose binaries are in --bin: the data path of a major upgrade
// Job. The report (JSON, one line) goes to --report and stdout.
func majorUpgradeCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("major-upgrade", flag.ContinueOnError)
	var a agentargs.MajorUpgrade
	a.Register(fs)
	bin, clientBin, data, work, port, markMoved, report := &a.Bin, &a.ClientBin, &a.Data, &a.WorkDir, &a.Port, &a.MarkMoved, &a.Report
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The new server runs as this process's user and runs code of the
	// database's roles while it loads: this process's environment (the
	// superuser's password) and memory must not be readable to it.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the upgrade's environment unreadable to the new server: %w", err)
	}
	for name, v := range map[string]string{"--bin": *bin, "--data": *data, "--work-dir": *work} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	host, user := os.Getenv("PGHOST"), os.Getenv("PGUSER")
	if host == "" || user == "" {
		return errors.New("PGHOST and PGUSER name the old server and its superuser (PGPORT, PGPASSWORD as needed)")
	}
	oldPort := 5432
	if p := os.Getenv("PGPORT"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("PGPORT %q: not a port", p)
		}
		oldPort = n
	}
	if err := os.MkdirAll(*work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(*work)
	if *clientBin == "" {
		*clientBin = *bin
	}
	// How the old server is authenticated goes to its connections only.
	var oldEnv []string
	for _, k := range []string{"PGSSLMODE", "PGSSLROOTCERT", "PGCHANNELBINDING", "PGREQUIREAUTH"} {
		if v, ok := os.LookupEnv(k); ok {
			oldEnv = append(oldEnv, k+"="+v)
		}
	}
	plan := majorupgrade.Plan{
		ClientBin: *clientBin, NewBin: *bin, OldHost: host, OldPort: oldPort, OldEnv: oldEnv,
		NewData: *data, WorkDir: *work, NewPort: *port, User: user, Password: os.Getenv("PGPASSWORD"),
		Log: func(step, _ string) { fmt.Fprintf(os.Stderr, "step %s\n", step) },
	}
	res, err := majorupgrade.Run(ctx, plan)
	rep := majorupgrade.ReportOf(plan, res, err)
	b, _ := json.Marshal(rep)
	fmt.Fprintln(stdout, string(b))
	if *report != "" {
		if werr := os.WriteFile(filepath.Clean(*report), b, 0o644); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if !rep.OK {
		return fmt.Errorf("failed at step %s: %s", rep.Step, rep.Error)
	}
	if *markMoved && err == nil {
		err = os.WriteFile(instance.MovedMarker(*data), []byte("moved by chartpilot major-upgrade\n"), 0o600)
	}
	return err
}
