package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// notReleases are chartpilot kinds of the "chartpilot" category that are
// not releases.
var notReleases = []string{"tenants", "backups", "backupstores", "clusterbackupstores"}

// getRow is one resource as `chartpilot get` shows it.
type getRow struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Ready     string `json:"ready"`
	Reason    string `json:"reason,omitempty"`
	Chart     string `json:"chart,omitempty"`
	Deployed  string `json:"deployedVersion,omitempty"`
	Desired   string `json:"desiredVersion,omitempty"`
	Revision  int64  `json:"revision,omitempty"`
	Upgrade   string `json:"upgrade,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	Message   string `json:"message,omitempty"`
	Created   string `json:"created"`
}

const getUsage = `Usage:
  chartpilot get [KIND] [-n NAMESPACE | -A] [-o wide|json]

One line per resource of a kind chartpilot manages: Ready (and why not;
in colour on a terminal, unless NO_COLOR is set),
chart deployed (→ desired), revision, upgrade state, tenant, age. Without KIND,
every kind of the "chartpilot" category (add it to your CRD's
spec.names.categories to have it listed). Reads through the API server
with your kubeconfig: one list per kind.

Flags:
`

// getCommand is `chartpilot get`.
func getCommand(ctx context.Context, args []string, stdout, stderr io.Writer, now time.Time) error {
	fs := flag.NewFlagSet("chartpilot get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, getUsage); fs.PrintDefaults() }
	var conn connFlags
	conn.register(fs)
	namespace := fs.String("n", "", "namespace (default: the context's)")
	all := fs.Bool("A", false, "every namespace")
	output := fs.String("o", "", "output: wide, json or yaml")
	// KIND may come before the flags, as with kubectl.
	var kind string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		kind, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 || (kind != "" && fs.NArg() > 0) {
		return fmt.Errorf("at most one KIND: got %q", append([]string{kind}, fs.Args()...))
	}
	if kind == "" && fs.NArg() == 1 {
		kind = fs.Arg(0)
	}
	if *output != "" && *output != "wide" && *output != "json" && *output != "yaml" {
		return fmt.Errorf("-o %q: must be wide, json or yaml", *output)
	}
	cfg, ns, err := conn.connect(*namespace)
	if err != nil {
		return err
	}
	if *all {
		ns = ""
	}
	rows, err := listReleases(ctx, cfg, kind, ns)
	if err != nil {
		return err
	}
	if *output == "json" || *output == "yaml" || !colourful(stdout) {
		return printRows(terminalSafe(stdout), rows, *output, now)
	}
	// The table is made safe first; only then are its colours added.
	var table strings.Builder
	if err := printRows(terminalSafe(&table), rows, *output, now); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, colourReady(table.String()))
	return err
}

// kindTarget is a kind to list: its resource and its Kind.
type kindTarget struct {
	gvr  schema.GroupVersionResource
	kind string
}

// kindTargets resolves kind (a resource name, singular, Kind or short
// name; "" for every release kind of the chartpilot category) with the
// API server's discovery.
func kindTargets(cfg *rest.Config, kind string) ([]kindTarget, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lists, err := dc.ServerPreferredNamespacedResources()
	if err != nil && len(lists) == 0 {
		return nil, fmt.Errorf("reading the API server's kinds: %w", err)
	}
	var targets []kindTarget
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			match := false
			if kind == "" {
				match = slices.Contains(r.Categories, "chartpilot") && !slices.Contains(notReleases, r.Name)
			} else {
				k := strings.ToLower(kind)
				names := append([]string{r.Name, r.SingularName, strings.ToLower(r.Kind), r.Name + "." + gv.Group}, r.ShortNames...)
				match = slices.Contains(names, k)
			}
			if match {
				targets = append(targets, kindTarget{gv.WithResource(r.Name), r.Kind})
			}
		}
	}
	if len(targets) == 0 {
		if kind != "" {
			return nil, fmt.Errorf("the API server serves no namespaced kind %q", kind)
		}
		return nil, errors.New("the API server serves no kind of the chartpilot category: install chartpilot's CRDs")
	}
	return targets, nil
}

// findKind resolves one kind.
func findKind(cfg *rest.Config, kind string) (kindTarget, error) {
	ts, err := kindTargets(cfg, kind)
	if err != nil {
		return kindTarget{}, err
	}
	if len(ts) > 1 {
		return kindTarget{}, fmt.Errorf("%q names %d kinds: use resource.group (e.g. %s.%s)", kind, len(ts), ts[0].gvr.Resource, ts[0].gvr.Group)
	}
	return ts[0], nil
}

// listReleases lists the resources of kind (or of every release kind of
// the chartpilot category) in namespace ("" for all).
func listReleases(ctx context.Context, cfg *rest.Config, kind, namespace string) ([]getRow, error) {
	targets, err := kindTargets(cfg, kind)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var rows []getRow
	if err := eachResource(ctx, dyn, targets, namespace, func(kind string, u *unstructured.Unstructured) {
		rows = append(rows, rowOf(kind, u))
	}); err != nil {
		return nil, err
	}
	if len(rows) > 0 {
		tenants := tenantsByNamespace(ctx, dyn)
		for i := range rows {
			rows[i].Tenant = tenants[rows[i].Namespace]
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return rows, nil
}

// eachResource lists the resources of targets in namespace ("" for all),
// in pages of 500, and calls f with each.
func eachResource(ctx context.Context, dyn dynamic.Interface, targets []kindTarget, namespace string, f func(kind string, u *unstructured.Unstructured)) error {
	for _, t := range targets {
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := dyn.Resource(t.gvr).Namespace(namespace).List(ctx, opts)
			if err != nil {
				return fmt.Errorf("listing %s: %w", t.gvr.Resource, err)
			}
			for i := range list.Items {
				f(t.kind, &list.Items[i])
			}
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	return nil
}

// tenantsByNamespace maps each namespace a Tenant claims (its
// status.namespaces, as the operator resolved them) to the Tenant's name:
// one list; none where the Tenant kind is not installed or readable.
func tenantsByNamespace(ctx context.Context, dyn dynamic.Interface) map[string]string {
	out := map[string]string{}
	list, err := dyn.Resource(v1alpha1.GroupVersion.WithResource("tenants")).List(ctx, metav1.ListOptions{})
	if err != nil {
		return out
	}
	for i := range list.Items {
		t, err := tenantOf(&list.Items[i])
		if err != nil {
			continue
		}
		for _, ns := range t.Status.Namespaces {
			if prev := out[ns]; prev != "" {
				out[ns] = prev + "," + t.Name // overlapping Tenants: both
			} else {
				out[ns] = t.Name
			}
		}
	}
	return out
}

// rowOf reads a resource's status as the reconciler writes it.
func rowOf(kind string, u *unstructured.Unstructured) getRow {
	r := getRow{Kind: kind, Namespace: u.GetNamespace(), Name: u.GetName(), Ready: "Unknown", Created: u.GetCreationTimestamp().UTC().Format(time.RFC3339)}
	st := v1alpha1.ReadReleaseStatus(u)
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); c != nil {
		r.Ready = string(c.Status)
		if c.ObservedGeneration != 0 && c.ObservedGeneration != u.GetGeneration() && c.Status == metav1.ConditionTrue {
			r.Ready = "Unknown" // judged for an older spec
		}
		if r.Ready != "True" {
			r.Reason, r.Message = c.Reason, c.Message
		}
	}
	if ch := st.Chart; ch != nil {
		r.Chart, r.Deployed, r.Desired = ch.Name, ch.DeployedVersion, ch.DesiredVersion
	}
	if rel := st.Release; rel != nil {
		if r.Chart == "" {
			r.Chart, r.Deployed = rel.ChartName, rel.ChartVersion
		}
		r.Revision = int64(rel.Revision)
	}
	if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpgradeBlocked); c != nil && c.Status == metav1.ConditionTrue {
		r.Upgrade = c.Reason
	} else if c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReconciling); c != nil && c.Status == metav1.ConditionTrue {
		r.Upgrade = c.Reason
	}
	return r
}

func printRows(w io.Writer, rows []getRow, output string, now time.Time) error {
	if rows == nil {
		rows = []getRow{}
	}
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case "yaml":
		b, err := yaml.Marshal(rows)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "KIND\tNAMESPACE\tNAME\tREADY\tCHART\tREVISION\tUPGRADE\tTENANT\tAGE"
	if output == "wide" {
		header += "\tMESSAGE"
	}
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		ready := r.Ready
		if r.Reason != "" {
			ready += " (" + r.Reason + ")"
		}
		chart := "-"
		if r.Chart != "" || r.Deployed != "" {
			chart = strings.TrimPrefix(r.Chart+" "+r.Deployed, " ")
			if r.Desired != "" && r.Desired != r.Deployed {
				chart += " → " + r.Desired
			}
		}
		rev := "-"
		if r.Revision > 0 {
			rev = fmt.Sprint(r.Revision)
		}
		upgrade := r.Upgrade
		if upgrade == "" {
			upgrade = "-"
		}
		created, _ := time.Parse(time.RFC3339, r.Created)
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Kind, r.Namespace, r.Name, ready, chart, rev, upgrade, orDash(r.Tenant), shortAge(now.Sub(created)))
		if output == "wide" {
			line += "\t" + oneLineMsg(r.Message)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func oneLineMsg(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// shortAge is a duration as kubectl shows it (2d, 5h, 3m, 40s).
func shortAge(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	case d >= 2*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	case d >= 2*time.Minute:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 0:
		return "0s"
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}
