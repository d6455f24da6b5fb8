package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// describeCommand is `chartpilot describe KIND/NAME`: conditions, the
// release, chart versions, the history of actions, the last failure and
// the resource's events.
func describeCommand(ctx context.Context, args []string, stdout, stderr io.Writer, now time.Time) error {
	fs := flag.NewFlagSet("chartpilot describe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn connFlags
	conn.register(fs)
	namespace := fs.String("n", "", "namespace (default: the context's)")
	var target string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		target, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if target == "" && fs.NArg() == 1 {
		target = fs.Arg(0)
	}
	kind, name, ok := strings.Cut(target, "/")
	if !ok || kind == "" || name == "" {
		return errors.New("usage: chartpilot describe KIND/NAME [-n NAMESPACE]")
	}
	cfg, ns, err := conn.connect(*namespace)
	if err != nil {
		return err
	}
	t, err := findKind(cfg, kind)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	u, err := dyn.Resource(t.gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	st := &v1alpha1.ReleaseStatus{}
	if raw, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, st); err != nil {
			return fmt.Errorf("reading the status of %s/%s: %w", kind, name, err)
		}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(u.GetUID())).String()})
	if err != nil {
		return fmt.Errorf("listing the events of %s/%s: %w", kind, name, err)
	}
	return printDescription(stdout, t.kind, u, st, events.Items, now)
}

func printDescription(w io.Writer, kind string, u *unstructured.Unstructured, st *v1alpha1.ReleaseStatus, events []corev1.Event, now time.Time) error {
	fmt.Fprintf(w, "%s %s/%s (generation %d, status for generation %d, created %s ago)\n", kind, u.GetNamespace(), u.GetName(), u.GetGeneration(), st.ObservedGeneration, shortAge(now.Sub(u.GetCreationTimestamp().Time)))
	if r := st.Release; r != nil {
		fmt.Fprintf(w, "Release:     %s revision %d, %s %s (%s)\n", r.Name, r.Revision, r.ChartName, r.ChartVersion, r.Status)
	}
	if c := st.Chart; c != nil {
		line := fmt.Sprintf("Chart:       %s deployed %s", c.Name, orDash(c.DeployedVersion))
		if c.DesiredVersion != "" && c.DesiredVersion != c.DeployedVersion {
			line += ", wanted " + c.DesiredVersion
		}
		if c.AvailableUpgrade != "" {
			line += ", newer available " + c.AvailableUpgrade
		}
		if c.FailedVersion != "" {
			line += ", failed " + c.FailedVersion
		}
		fmt.Fprintln(w, line)
	}
	if kind == "Postgres" {
		printBackups(w, u, now)
		printRecovery(w, u)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nConditions:")
	fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tSINCE\tMESSAGE")
	for _, c := range st.Conditions {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, shortAge(now.Sub(c.LastTransitionTime.Time)), oneLineMsg(c.Message))
	}
	_ = tw.Flush()
	if len(st.History) > 0 {
		fmt.Fprintln(w, "\nHistory (newest first):")
		fmt.Fprintln(tw, "  ACTION\tREVISION\tCHART\tRESULT\tAGO\tMESSAGE")
		for _, h := range st.History {
			result := "failed"
			if h.Succeeded {
				result = "succeeded"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\n", h.Action, h.Revision, orDash(h.ChartVersion), result, shortAge(now.Sub(h.Time.Time)), oneLineMsg(h.Message))
		}
		_ = tw.Flush()
	}
	if len(st.ValuesLayers) > 0 {
		fmt.Fprintln(w, "\nValues layers (later ones win; keys only):")
		for _, l := range st.ValuesLayers {
			fmt.Fprintf(tw, "  %s\t%s\n", l.Name, strings.Join(l.Keys, ", "))
		}
		_ = tw.Flush()
	}
	if f := st.LastFailure; f != nil {
		fmt.Fprintf(w, "\nLast failure: %s, %d time(s) in a row, %s ago: %s\n", f.Action, f.Count, shortAge(now.Sub(f.Time.Time)), oneLineMsg(f.Message))
	}
	if len(events) > 0 {
		sort.SliceStable(events, func(i, j int) bool { return eventTime(events[i]).Before(eventTime(events[j])) })
		fmt.Fprintln(w, "\nEvents:")
		fmt.Fprintln(tw, "  TYPE\tREASON\tAGO\tCOUNT\tMESSAGE")
		for _, e := range events {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\n", e.Type, e.Reason, shortAge(now.Sub(eventTime(e))), max(e.Count, 1), oneLineMsg(e.Message))
		}
		_ = tw.Flush()
	}
	return nil
}

// printBackups shows a Postgres's status.backup: its logical backups and
// drills, its base backups, and what its WAL archive can recover to.
func printBackups(w io.Writer, u *unstructured.Unstructured, now time.Time) {
	raw, ok, _ := unstructured.NestedMap(u.Object, "status", "backup")
	if !ok {
		return
	}
	var b v1alpha1.PostgresBackupStatus
	if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &b) != nil {
		return
	}
	at := func(t *metav1.Time) string {
		if t == nil {
			return "-"
		}
		d := now.Sub(t.Time)
		if d < 0 {
			return t.UTC().Format(time.RFC3339) + " (in " + shortAge(-d) + ")"
		}
		return t.UTC().Format(time.RFC3339) + " (" + shortAge(d) + " ago)"
	}
	fmt.Fprintln(w, "\nBackups:")
	fmt.Fprintf(w, "  Logical:      last %s at %s, next %s\n", orDash(b.LastSuccessfulBackup), at(b.LastSuccessTime), at(b.NextScheduleTime))
	if b.LastVerifyResult != "" {
		fmt.Fprintf(w, "  Drill:        %s\n", oneLineMsg(b.LastVerifyResult))
	}
	if b.LastBaseBackup != "" || b.NextBaseBackupTime != nil {
		fmt.Fprintf(w, "  Base backup:  last %s at %s, next %s\n", orDash(b.LastBaseBackup), at(b.LastBaseBackupTime), at(b.NextBaseBackupTime))
	}
	if a := b.Archive; a != nil {
		fmt.Fprintf(w, "  Recoverable:  from %s to %s (last WAL %s; %d base backups, %d files; read %s)\n",
			at(a.FirstRecoverableTime), at(a.LastArchivedTime), orDash(a.LastArchivedWAL), a.BaseBackups, a.Files, at(a.CheckedAt))
	}
	if b.LastPruneResult != "" {
		fmt.Fprintf(w, "  Prune:        %s\n", oneLineMsg(b.LastPruneResult))
	}
	if a, ok, _ := unstructured.NestedMap(u.Object, "status", "archiving"); ok {
		line := fmt.Sprint(a["state"])
		if m, _ := a["message"].(string); m != "" {
			line += ": " + oneLineMsg(m)
		}
		fmt.Fprintf(w, "  Archiving:    %s\n", line)
	}
}

// printRecovery shows a Postgres's status.recovery: what it was recovered
// from, and to where.
func printRecovery(w io.Writer, u *unstructured.Unstructured) {
	raw, ok, _ := unstructured.NestedMap(u.Object, "status", "recovery")
	if !ok {
		return
	}
	var r v1alpha1.PostgresRecoveryStatus
	if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &r) != nil {
		return
	}
	fmt.Fprintln(w, "\nRecovery:")
	fmt.Fprintf(w, "  Phase:        %s, to %s\n", r.Phase, orDash(r.Target))
	if r.BaseBackup != "" {
		fmt.Fprintf(w, "  From:         %s\n", r.BaseBackup)
	}
	if r.Timeline != 0 || r.LastTransactionTime != "" {
		fmt.Fprintf(w, "  Reached:      timeline %d, last transaction committed at %s\n", r.Timeline, orDash(r.LastTransactionTime))
	}
	if r.Message != "" && r.Phase != v1alpha1.RecoveryCompleted {
		fmt.Fprintf(w, "  Message:      %s\n", oneLineMsg(r.Message))
	}
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
