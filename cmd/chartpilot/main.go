// Command chartpilot is the chartpilot operator.
//
//	chartpilot run      the manager: reconciles the kinds listed in watches.yaml
//	chartpilot rbac     prints the manager's ClusterRole, derived from watches.yaml
//	chartpilot backup   backs a stream up to a store, or restores one (a backup Job's command)
//	chartpilot get      lists the resources chartpilot manages, one line each
//	chartpilot describe shows one resource: conditions, history, last failure, events
//	chartpilot rollout  shows where a kind's fleet stands on chart versions
//	chartpilot tenants  lists the tenants: namespaces, usage against limits, violations
//	chartpilot identity creates the ServiceAccount a namespace's resources are deployed as
//	chartpilot version  prints the version
package main

import (
	"context"
	"fmt"
	"os"
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
  chartpilot store                                   the store helper: one request of the manager on stdin, its answer on stdout
  chartpilot get [KIND] [-n NS | -A] [-o wide|json]  list the resources chartpilot manages
  chartpilot describe KIND/NAME [-n NS]              conditions, history, last failure and events of one
  chartpilot rollout status KIND [--version V] [--watch]  the fleet by chart version and upgrade state
  chartpilot tenants                                  tenants: namespaces, usage against limits, violations
  chartpilot identity create -n NS                    the ServiceAccount NS's resources are deployed as (lockdown)
  chartpilot instance        the instance manager of a PostgreSQL member (failover through a Lease)
  chartpilot major-upgrade [flags]                    move a PostgreSQL server's data to a new major (a major upgrade Job)
  chartpilot version         print the version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		if err := run(ctrl.SetupSignalHandler(), os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot run: %v\n", err)
			os.Exit(1)
		}
	case "rbac":
		if err := rbacCommand(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot rbac: %v\n", err)
			os.Exit(1)
		}
	case "backup":
		if err := backupCommand(ctrl.SetupSignalHandler(), os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot backup: %v\n", err)
			os.Exit(1)
		}
	case "instance":
		if err := instanceCommand(ctrl.SetupSignalHandler(), os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot instance: %v\n", err)
			os.Exit(1)
		}
	case "major-upgrade":
		if err := majorUpgradeCommand(ctrl.SetupSignalHandler(), os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot major-upgrade: %v\n", err)
			os.Exit(1)
		}
	case "store":
		if err := storeCommand(ctrl.SetupSignalHandler(), os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot store: %v\n", err)
			os.Exit(1)
		}
	case "install-agent":
		if err := installAgent(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot install-agent: %v\n", err)
			os.Exit(1)
		}
	case "get":
		if err := getCommand(context.Background(), os.Args[2:], os.Stdout, os.Stderr, time.Now()); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot get: %v\n", err)
			os.Exit(1)
		}
	case "describe":
		if err := describeCommand(context.Background(), os.Args[2:], terminalSafe(os.Stdout), os.Stderr, time.Now()); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot describe: %v\n", err)
			os.Exit(1)
		}
	case "rollout":
		if err := rolloutCommand(ctrl.SetupSignalHandler(), os.Args[2:], terminalSafe(os.Stdout), os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot rollout: %v\n", err)
			os.Exit(1)
		}
	case "tenants":
		if err := tenantsCommand(context.Background(), os.Args[2:], terminalSafe(os.Stdout), os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot tenants: %v\n", err)
			os.Exit(1)
		}
	case "identity":
		if err := identityCommand(context.Background(), os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "chartpilot identity: %v\n", err)
			os.Exit(1)
		}
	case "version", "--version":
		fmt.Println(version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "chartpilot: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
