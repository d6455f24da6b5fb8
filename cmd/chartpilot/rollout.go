package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// rolloutSummary is where a kind's fleet stands on chart versions.
type rolloutSummary struct {
	total     int
	byVersion map[string]int // deployed chart version → resources
	onTarget  int            // deployed the target version and Ready
	states    map[string][]string
}

// Rollout states, from a resource's conditions.
const (
	stateUpgrading  = "upgrading"
	stateQueued     = "queued (maxConcurrentUpgrades)"
	stateCanaries   = "waiting for canaries"
	stateWindow     = "waiting for a maintenance window"
	stateHalted     = "halted (a canary failed)"
	stateBlocked    = "blocked (needs an opt-in)"
	stateFailed     = "failed or rolled back"
	stateNotReady   = "deployed, not Ready"
	stateOnTarget   = "on the target, Ready"
	stateOtherReady = "Ready on another version"
)

// rolloutCommand is `chartpilot rollout status KIND [--version V] [--watch]`.
func rolloutCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const use = "usage: chartpilot rollout status KIND [--version V] [-n NS | -A] [--watch]"
	if helpRequested(args) || (len(args) == 2 && args[0] == "status" && helpRequested(args[1:])) {
		return printHelp(stdout, use)
	}
	if len(args) < 2 || args[0] != "status" || strings.HasPrefix(args[1], "-") {
		return errors.New(use)
	}
	kind := args[1]
	fs := flag.NewFlagSet("chartpilot rollout status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn connFlags
	conn.register(fs)
	namespace := fs.String("n", "", "namespace (default: every namespace)")
	version := fs.String("version", "", "target chart version (default: the newest one any resource wants)")
	watch := fs.Bool("watch", false, "redraw every 2 s until the rollout ends (exit 0) or halts (exit 1)")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	cfg, _, err := conn.connect("")
	if err != nil {
		return err
	}
	out := &changedFrames{w: stdout}
	for {
		rows, err := listReleases(ctx, cfg, kind, *namespace)
		if err != nil {
			return err
		}
		target := *version
		if target == "" {
			target = newestWanted(rows)
		}
		s := summarise(rows, target)
		label := kind
		if len(rows) > 0 {
			label = rows[0].Kind
		}
		var frame bytes.Buffer
		printRollout(&frame, label, target, s)
		out.print(frame.Bytes())
		switch {
		case len(s.states[stateHalted]) > 0 && *watch:
			return errors.New("the rollout is halted")
		case !*watch:
			return nil
		case s.onTarget == s.total:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// changedFrames prints a frame of --watch only when it differs from the
// one printed before, so that a watch into a pipe or a log is a list of
// changes, not the same frame every 2 s. Frames after the first are set
// off by a blank line.
type changedFrames struct {
	w       io.Writer
	last    []byte
	printed bool
}

func (c *changedFrames) print(frame []byte) {
	if c.printed {
		if bytes.Equal(frame, c.last) {
			return
		}
		fmt.Fprintln(c.w)
	}
	c.w.Write(frame)
	c.last = append(c.last[:0], frame...)
	c.printed = true
}

// newestWanted is the highest desired (else deployed) version among rows,
// by string order of dotted numbers.
func newestWanted(rows []getRow) string {
	best := ""
	for _, r := range rows {
		v := r.Desired
		if v == "" {
			v = r.Deployed
		}
		if v != "" && (best == "" || versionLess(best, v)) {
			best = v
		}
	}
	return best
}

// versionLess compares dotted versions numerically where it can.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		var x, y int
		_, ex := fmt.Sscan(as[i], &x)
		_, ey := fmt.Sscan(bs[i], &y)
		if ex != nil || ey != nil {
			if as[i] != bs[i] {
				return as[i] < bs[i]
			}
			continue
		}
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

func summarise(rows []getRow, target string) rolloutSummary {
	s := rolloutSummary{total: len(rows), byVersion: map[string]int{}, states: map[string][]string{}}
	for _, r := range rows {
		v := r.Deployed
		if v == "" {
			v = "none"
		}
		s.byVersion[v]++
		state := stateOfRow(r, target)
		if state == stateOnTarget {
			s.onTarget++
		}
		s.states[state] = append(s.states[state], r.Namespace+"/"+r.Name)
	}
	return s
}

func stateOfRow(r getRow, target string) string {
	switch r.Upgrade {
	case "Upgrading", "Installing", "Progressing":
		return stateUpgrading
	case "UpgradeQueued":
		return stateQueued
	case "WaitingForCanaries":
		return stateCanaries
	case "WaitingForMaintenanceWindow", "InvalidMaintenanceWindow":
		return stateWindow
	case "RolloutHalted":
		return stateHalted
	case "MajorUpgradeBlocked", "MajorVersionChangeBlocked", "DowngradeRefused":
		return stateBlocked
	case "UpgradeFailed", "RolledBack", "InstallFailed":
		return stateFailed
	}
	switch {
	case r.Ready == "True" && r.Deployed == target:
		return stateOnTarget
	case r.Ready == "True":
		return stateOtherReady
	case strings.Contains(r.Reason, "Failed") || r.Reason == "RolledBack":
		return stateFailed
	}
	return stateNotReady
}

func printRollout(w io.Writer, kind, target string, s rolloutSummary) {
	fmt.Fprintf(w, "%s: %d of %d on chart version %s and Ready\n", kind, s.onTarget, s.total, orDash(target))
	versions := make([]string, 0, len(s.byVersion))
	for v := range s.byVersion {
		versions = append(versions, v)
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[j], versions[i]) })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  DEPLOYED VERSION\tRESOURCES")
	for _, v := range versions {
		fmt.Fprintf(tw, "  %s\t%d\n", v, s.byVersion[v])
	}
	_ = tw.Flush()
	fmt.Fprintln(tw, "  STATE\tRESOURCES\tSOME OF THEM")
	for _, st := range []string{stateOnTarget, stateUpgrading, stateQueued, stateCanaries, stateWindow, stateHalted, stateBlocked, stateFailed, stateNotReady, stateOtherReady} {
		names := s.states[st]
		if len(names) == 0 {
			continue
		}
		sort.Strings(names)
		some := strings.Join(names[:min(3, len(names))], ", ")
		if len(names) > 3 {
			some += ", …"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", st, len(names), some)
	}
	_ = tw.Flush()
}
