package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/kubeapis"
)

const preflightUsage = `Usage:
  chartpilot preflight [KIND] [--kubernetes-version 1.MINOR] [-n NAMESPACE] [-o json]

Before a cluster upgrade: every release chartpilot manages whose stored
manifest names an API version that Kubernetes 1.MINOR no longer serves
(or that this cluster already does not serve), with the kind, the minor
that removes it and its replacement. Exits 1 when any release would break,
0 when none would. The default version is the minor after the cluster's.
It reads status.deprecatedAPIs, which the operator keeps from each
release's stored manifest: one list per kind, no Secret read. Without
KIND, every kind of the "chartpilot" category.

Flags:
`

// preflightRow is one kind of one release that breaks on the target minor.
type preflightRow struct {
	Kind        string `json:"kind"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	APIVersion  string `json:"apiVersion"`
	APIKind     string `json:"apiKind"`
	Objects     int32  `json:"objects"`
	RemovedIn   string `json:"removedIn,omitempty"`
	Served      bool   `json:"served"`
	Replacement string `json:"replacement,omitempty"`
}

// preflightReport is the -o json form of the report.
type preflightReport struct {
	KubernetesVersion string         `json:"kubernetesVersion"`
	Releases          int            `json:"releases"`
	Breaking          int            `json:"breaking"`
	Rows              []preflightRow `json:"rows"`
}

// preflightCommand is `chartpilot preflight`.
func preflightCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chartpilot preflight", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, preflightUsage); fs.PrintDefaults() }
	var conn connFlags
	conn.register(fs)
	target := fs.String("kubernetes-version", "", "the Kubernetes minor to check against, e.g. 1.38 (default: the minor after the cluster's)")
	namespace := fs.String("n", "", "namespace (default: every namespace)")
	output := fs.String("o", "", "output: json, or a table")
	// KIND may come before the flags, as with kubectl.
	var kind string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		kind, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: at most one KIND, before the flags", fs.Args())
	}
	if *output != "" && *output != "json" {
		return fmt.Errorf("-o %q: must be json, or left out for a table", *output)
	}
	cfg, ns, err := conn.connect(*namespace)
	if err != nil {
		return err
	}
	if *namespace == "" {
		ns = ""
	}
	minor, err := preflightTarget(cfg, *target)
	if err != nil {
		return err
	}
	targets, err := kindTargets(cfg, kind)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	rep := preflightReport{KubernetesVersion: minor.String(), Rows: []preflightRow{}}
	breaking := map[string]bool{}
	if err := eachResource(ctx, dyn, targets, ns, func(kind string, u *unstructured.Unstructured) {
		rep.Releases++
		rows := breakingAPIs(kind, u.GetNamespace(), u.GetName(), u.Object, minor)
		if len(rows) > 0 {
			breaking[kind+"/"+u.GetNamespace()+"/"+u.GetName()] = true
		}
		rep.Rows = append(rep.Rows, rows...)
	}); err != nil {
		return err
	}
	rep.Breaking = len(breaking)
	sort.SliceStable(rep.Rows, func(i, j int) bool {
		a, b := rep.Rows[i], rep.Rows[j]
		return a.Kind+"/"+a.Namespace+"/"+a.Name < b.Kind+"/"+b.Namespace+"/"+b.Name
	})
	if err := printPreflight(terminalSafe(stdout), rep, *output); err != nil {
		return err
	}
	if rep.Breaking > 0 {
		return fmt.Errorf("%d of %d releases would break on Kubernetes %s", rep.Breaking, rep.Releases, minor)
	}
	return nil
}

// preflightTarget is the minor given, or the one after the cluster's.
func preflightTarget(cfg *rest.Config, given string) (kubeapis.Minor, error) {
	if given != "" {
		m, err := kubeapis.ParseMinor(given)
		if err != nil {
			return 0, fmt.Errorf("--kubernetes-version: %w", err)
		}
		return m, nil
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return 0, err
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return 0, fmt.Errorf("reading the cluster's version (or give --kubernetes-version): %w", err)
	}
	m, err := kubeapis.FromServer(v.Major, v.Minor)
	if err != nil {
		return 0, fmt.Errorf("the cluster's version %s: %w (give --kubernetes-version)", v.GitVersion, err)
	}
	return m + 1, nil
}

// breakingAPIs are the rows of a release whose status.deprecatedAPIs
// break on minor.
func breakingAPIs(kind, namespace, name string, obj map[string]any, minor kubeapis.Minor) []preflightRow {
	var st struct {
		Status struct {
			DeprecatedAPIs []v1alpha1.DeprecatedAPI `json:"deprecatedAPIs"`
		} `json:"status"`
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &st); err != nil {
		// Unreadable is not clean: the release is counted, and says why.
		return []preflightRow{{Kind: kind, Namespace: namespace, Name: name, APIVersion: "?", APIKind: "status.deprecatedAPIs unreadable", RemovedIn: "?", Served: true}}
	}
	var rows []preflightRow
	for _, a := range st.Status.DeprecatedAPIs {
		removed, err := kubeapis.ParseMinor(a.RemovedIn)
		if a.Served && (err != nil || removed > minor) {
			continue
		}
		repl := a.Replacement
		if repl != "" && a.ReplacementKind != "" {
			repl += " " + a.ReplacementKind
		}
		rows = append(rows, preflightRow{Kind: kind, Namespace: namespace, Name: name, APIVersion: a.APIVersion, APIKind: a.Kind,
			Objects: a.Objects, RemovedIn: a.RemovedIn, Served: a.Served, Replacement: repl})
	}
	return rows
}

func printPreflight(w io.Writer, rep preflightReport, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if len(rep.Rows) == 0 {
		_, err := fmt.Fprintf(w, "No release of %d uses an API version that Kubernetes %s does not serve.\n", rep.Releases, rep.KubernetesVersion)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAMESPACE\tNAME\tAPI VERSION\tAPI KIND\tOBJECTS\tREMOVED IN\tREPLACEMENT")
	for _, r := range rep.Rows {
		removed := r.RemovedIn
		if !r.Served {
			removed = "not served now"
		}
		repl := r.Replacement
		if repl == "" {
			repl = "none"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Kind, r.Namespace, r.Name, r.APIVersion, r.APIKind, r.Objects, removed, repl)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d of %d releases would break on Kubernetes %s.\n", rep.Breaking, rep.Releases, rep.KubernetesVersion)
	return err
}
