package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// realPodsResult is what test/nodes measured on real pods: its JSON lines.
type realPodsResult struct {
	failovers []map[string]any
	backup    map[string]any
	major     map[string]any
	pitrLoss  map[string]any
}

// runRealPodsBench runs test/nodes' failover, backup and major-upgrade
// tests on real pods (containerd, runc, a kubelet; root needed) with
// failovers failovers of the primary kept down past its Lease and mb MiB
// added to the databases backed up and upgraded (0: as the tests seed),
// and reads their measurements back.
func runRealPodsBench(root string, failovers, mb int) (*realPodsResult, error) {
	dir, err := os.MkdirTemp("", "chartpilot-bench-nodes-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "report.jsonl")
	cmd := exec.Command("go", "test", "-count=1", "-timeout", "90m", "-v",
		"-run", "^(TestFailoverOnRealPods|TestBackupRestoreOnRealPods|TestMajorUpgradeOnRealPods|TestPointInTimeRecoveryOnRealPods)$", "./test/nodes",
		"-args", "-failover-runs", strconv.Itoa(failovers), "-data-mb", strconv.Itoa(mb), "-report", out)
	cmd.Dir = root
	log, err := os.Create(filepath.Join(root, "bin", "bench-nodes.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	logf("real pods: test/nodes with %d failovers and %d MiB (log in bin/bench-nodes.log)", failovers, mb)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("test/nodes: %w (see bin/bench-nodes.log)", err)
	}
	f, err := os.Open(out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &realPodsResult{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := map[string]any{}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return nil, fmt.Errorf("report line %q: %w", sc.Text(), err)
		}
		switch m["kind"] {
		case "failover":
			r.failovers = append(r.failovers, m)
		case "backup":
			r.backup = m
		case "major":
			r.major = m
		case "pitr-loss":
			r.pitrLoss = m
		}
	}
	return r, sc.Err()
}

// num reads a number of a report line (JSON numbers, or the strings SQL
// sums are read as).
func num(m map[string]any, key string) float64 {
	switch v := m[key].(type) {
	case float64:
		return v
	case string:
		f, _ := strconv.ParseFloat(v, 64)
		return f
	}
	return 0
}

func printRealPods(r *realPodsResult) {
	if r == nil {
		return
	}
	const mib = 1 << 20
	fmt.Printf("\nOn real pods (test/nodes: the operator installed by its chart, PostgreSQL 15 and 17 images from Debian's packages, a writer through the read-write Service)\n\n")
	fmt.Println("| failover: what happened to the primary | from → to | to the first row acknowledged (s) | rows acknowledged | acknowledged rows lost |")
	fmt.Println("|---|---|---:|---:|---:|")
	var kept []float64
	for _, f := range r.failovers {
		fmt.Printf("| %s | %s → %s | %.1f | %.0f | %.0f |\n", f["case"], f["from"], f["to"], num(f, "seconds"), num(f, "acked"), num(f, "lost"))
		if c, _ := f["case"].(string); strings.Contains(c, "kept_down") {
			kept = append(kept, num(f, "seconds"))
		}
	}
	if len(kept) > 0 {
		slices.Sort(kept)
		fmt.Printf("\nThe primary kept down past its Lease (10 s), %d times: median %.1f s to the first row on the new primary (%.1f–%.1f).\n", len(kept), kept[len(kept)/2], kept[0], kept[len(kept)-1])
	}
	if b := r.backup; b != nil {
		fmt.Println("\n| backup of a Postgres 15 (all databases) | server (MiB) | stored (MiB, zstd + age) | backup Job (s) | restore into a new Postgres, from its create to Ready (s) |")
		fmt.Println("|---|---:|---:|---:|---:|")
		fmt.Printf("| S3 (versitygw) on the node network | %.0f | %.0f | %.1f | %.1f |\n", num(b, "bytes")/mib, num(b, "stored")/mib, num(b, "backupSeconds"), num(b, "restoreSeconds"))
	}
	if l := r.pitrLoss; l != nil {
		fmt.Println("\n| a one-pod Postgres's volume and server lost at once under writes, recovered to the end of its archive | archive_timeout (s) | rows acknowledged | lost | lost rows acknowledged within the last (s) |")
		fmt.Println("|---|---:|---:|---:|---:|")
		fmt.Printf("| a new Postgres with spec.bootstrap.recovery | %.0f | %.0f | %.0f | %.1f |\n", num(l, "archiveTimeoutSeconds"), num(l, "acknowledged"), num(l, "lost"), num(l, "lostWindowSeconds"))
	}
	if m := r.major; m != nil {
		fmt.Println("\n| major upgrade 15 → 17 by the operator | server (MiB) | patch to the first row on 17 (s) | writes refused (s) | rows acknowledged | lost | rows compared |")
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
		fmt.Printf("| backup, data moved by the Job, StatefulSet replaced | %.0f | %.1f | %.1f | %.0f | %.0f | %.0f |\n", num(m, "bytes")/mib, num(m, "seconds"), num(m, "refusedSeconds"), num(m, "acked"), num(m, "lost"), num(m, "rows"))
	}
}
