// Command chartpilot is the chartpilot operator.
//
//	chartpilot run      the manager: reconciles the kinds listed in watches.yaml
//	chartpilot rbac     prints the manager's ClusterRole, derived from watches.yaml
//	chartpilot backup   backs a stream up to a store, or restores one (a backup Job's command)
//	chartpilot wal-push, wal-fetch   archive_command and restore_command: WAL to and from a store
//	chartpilot wal-serve             the WAL service those ask, holding the store's credentials
//	chartpilot base-backup           a physical base backup beside the WAL
//	chartpilot recover               a base backup and the WAL replayed to a point in time
//	chartpilot get      lists the resources chartpilot manages, one line each
//	chartpilot describe shows one resource: conditions, history, last failure, events
//	chartpilot rollout  shows where a kind's fleet stands on chart versions
//	chartpilot tenants  lists the tenants: namespaces, usage against limits, violations
//	chartpilot identity creates the ServiceAccount a namespace's resources are deployed as
//	chartpilot version  prints the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `chartpilot turns custom resources into healthy Helm releases.

Usage:
  chartpilot run [flags]     run the operator (chartpilot run --help for flags)
  chartpilot rbac [flags]    print the manager's ClusterRole for watches.yaml and its charts
  chartpilot backup run|restore [flags] -- COMMAND   back up COMMAND's output, or restore into its input
  chartpilot backup verify [flags]                   restore drill into a throwaway database
  chartpilot install-agent DIR                       copy this binary to DIR/chartpilot (backup Jobs of other images)
  chartpilot wal-push|wal-fetch [flags] ...          archive_command / restore_command of WAL (chartpilot wal-push --help)
  chartpilot wal-serve [flags]                       the WAL service wal-push and wal-fetch --via ask
  chartpilot base-backup [flags]                     a physical base backup stored beside the archived WAL
  chartpilot recover [flags]                         restore a base backup and replay the WAL to a point in time
  chartpilot store                                   the store helper: one request of the manager on stdin, its answer on stdout
  chartpilot get [KIND] [-n NS | -A] [-o wide|json]  list the resources chartpilot manages
  chartpilot describe KIND/NAME [-n NS]              conditions, history, last failure and events of one
  chartpilot rollout status KIND [--version V] [--watch]  the fleet by chart version and upgrade state
  chartpilot preflight [--kubernetes-version 1.MINOR] releases that break on that Kubernetes minor (exit 1 if any)
  chartpilot tenants                                  tenants: namespaces, usage against limits, violations
  chartpilot identity create -n NS                    the ServiceAccount NS's resources are deployed as (lockdown)
  chartpilot instance        the instance manager of a PostgreSQL member (failover through a Lease)
  chartpilot major-upgrade [flags]                    move a PostgreSQL server's data to a new major (a major upgrade Job)
  chartpilot version         print the version
`

// signalContext is cancelled on SIGTERM or SIGINT; controller-runtime's
// handler may be set up only once per process.
var signalContext = sync.OnceValue(ctrl.SetupSignalHandler)

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

// dispatch runs one command and returns the process's exit code: 0 on
// success and for --help (of any command, with or without a subcommand),
// 1 when the command failed, 2 for an unknown command.
func dispatch(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	name, rest := args[0], args[1:]
	var err error
	switch name {
	case "run":
		err = run(signalContext(), rest)
	case "rbac":
		err = rbacCommand(rest, os.Stdout)
	case "backup":
		err = backupCommand(signalContext(), rest, os.Stdout, os.Stderr)
	case "instance":
		err = instanceCommand(signalContext(), rest)
	case "major-upgrade":
		err = majorUpgradeCommand(signalContext(), rest, os.Stdout)
	case "wal-push", "wal-fetch", "wal-serve", "wal-status", "wal-prune", "base-backup", "recover":
		err = walCommand(signalContext(), name, rest, os.Stdout, os.Stderr)
	case "store":
		err = storeCommand(signalContext(), rest, os.Stdin, os.Stdout)
	case "install-agent":
		err = installAgent(rest)
	case "get":
		err = getCommand(context.Background(), rest, os.Stdout, os.Stderr, time.Now())
	case "describe":
		err = describeCommand(context.Background(), rest, terminalSafe(os.Stdout), os.Stderr, time.Now())
	case "preflight":
		err = preflightCommand(context.Background(), rest, os.Stdout, os.Stderr)
	case "rollout":
		err = rolloutCommand(signalContext(), rest, terminalSafe(os.Stdout), os.Stderr)
	case "tenants":
		err = tenantsCommand(context.Background(), rest, terminalSafe(os.Stdout), os.Stderr)
	case "identity":
		err = identityCommand(context.Background(), rest, os.Stdout, os.Stderr)
	case "version", "--version":
		fmt.Println(version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "chartpilot: unknown command %q\n\n%s", name, usage)
		return 2
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(os.Stderr, "chartpilot %s: %v\n", name, err)
	return 1
}

// helpRequested reports whether args asks for a command's help before any
// subcommand, so that commands with subcommands answer --help with their
// usage and success, as flag sets do.
func helpRequested(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help")
}

// printHelp writes a command's usage to w and returns flag.ErrHelp, which
// dispatch turns into exit code 0.
func printHelp(w io.Writer, text string) error {
	fmt.Fprintln(w, strings.TrimRight(text, "\n"))
	return flag.ErrHelp
}
