package main

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// rbacCommand prints the manager's ClusterRole, derived from watches.yaml
// and its charts.
func rbacCommand(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("chartpilot rbac", flag.ContinueOnError)
	watchesFile := fs.String("watches", "watches.yaml", "path to watches.yaml")
	impersonate := fs.String("impersonate", "", "comma-separated ServiceAccount names Helm may run as besides the watches' serviceAccountName (Tenants' serviceAccountName, --default-service-account)")
	webhook := fs.String("webhook-configuration", "chartpilot-validating", "ValidatingWebhookConfiguration whose caBundle the manager keeps (empty: none)")
	kubeVersion := fs.String("kube-version", "v1.37.2", "Kubernetes version the charts are rendered for")
	sa := fs.String("service-account", "chartpilot-system/manager", "namespace/name of the manager's ServiceAccount")
	crds := fs.String("crds", "config/crd", "directory of the CustomResourceDefinitions of the watched kinds (for their plural names)")
	deployer := fs.String("deployer", "", "lockdown: the ServiceAccount (--default-service-account) every resource's writes run as; the manager keeps reads of the charts' kinds, and a deployer ClusterRole holds the writes")
	rulesOnly := fs.Bool("rules-only", false, "print only the manager ClusterRole's rules, a YAML list, without impersonation (for charts/chartpilot)")
	deployerRulesOnly := fs.Bool("deployer-rules-only", false, "print only the deployer ClusterRole's rules, a YAML list (for charts/chartpilot)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ns, name, ok := strings.Cut(*sa, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--service-account %q: write namespace/name", *sa)
	}
	ws, err := watches.Load(*watchesFile)
	if err != nil {
		return err
	}
	o := rbac.Options{Watches: ws, WebhookConfiguration: *webhook, KubeVersion: *kubeVersion, ServiceAccountNamespace: ns, ServiceAccountName: name, Deployer: *deployer}
	if o.Plurals, err = readPlurals(*crds); err != nil {
		return err
	}
	for _, w := range ws {
		if w.ServiceAccountName != "" {
			o.Impersonate = append(o.Impersonate, w.ServiceAccountName)
		}
	}
	for _, n := range strings.Split(*impersonate, ",") {
		if n = strings.TrimSpace(n); n != "" {
			o.Impersonate = append(o.Impersonate, n)
		}
	}
	render := rbac.Render
	switch {
	case *rulesOnly && *deployerRulesOnly:
		return fmt.Errorf("--rules-only and --deployer-rules-only: choose one")
	case *rulesOnly:
		render = rbac.RenderRules
	case *deployerRulesOnly:
		render = rbac.RenderDeployerRules
	}
	b, err := render(o)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}

// readPlurals reads the CRDs under dir (none when dir is empty).
func readPlurals(dir string) (map[schema.GroupKind]string, error) {
	if dir == "" {
		return nil, nil
	}
	var docs [][]byte
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		docs = append(docs, b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("--crds %s: %w", dir, err)
	}
	return rbac.Plurals(docs...)
}
