package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/rbac"
)

// identityCommand is `chartpilot identity create -n NS`: the ServiceAccount
// that resources of NS are deployed as, bound there (and only there) to
// the deployer ClusterRole of the install.
func identityCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	use := fmt.Sprintf("usage: chartpilot identity create -n NAMESPACE [--service-account %s] [--cluster-role %s]", rbac.DefaultDeployer, rbac.DefaultDeployer)
	if helpRequested(args) {
		return printHelp(stdout, use)
	}
	if len(args) == 0 || args[0] != "create" {
		return errors.New(use)
	}
	fs := flag.NewFlagSet("chartpilot identity create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn connFlags
	conn.register(fs)
	ns := fs.String("n", "", "namespace (default: the context's)")
	fs.StringVar(ns, "namespace", "", "namespace (default: the context's)")
	sa := fs.String("service-account", rbac.DefaultDeployer, "ServiceAccount to create: the operator's --default-service-account")
	role := fs.String("cluster-role", rbac.DefaultDeployer, "ClusterRole to bind it to in the namespace: the install's deployer role")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg, namespace, err := conn.connect(*ns)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	lines, err := rbac.CreateDeployer(ctx, cs, namespace, *sa, *role)
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return err
}
