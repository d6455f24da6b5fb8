package testcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/nodebox"
)

// nodeCgroupPrefix starts the name of every real node's cgroup directory.
const nodeCgroupPrefix = "chartpilot-real-node-"

// cgroupPlace is where the real nodes' cgroups go on this machine: below
// the cgroup of this process in each hierarchy, so that what accounts for
// this process (or kills it) by its cgroup sees the nodes and their pods.
type cgroupPlace struct {
	// v2 is set on a host with the unified hierarchy only.
	v2 bool
	// parents are this process's cgroup directories, one per hierarchy.
	parents []string
	// roots are the hierarchies' mount points.
	roots []string
}

// cgroupPlacement reads this process's cgroups: v1 (each controller's
// hierarchy, and a v2 one beside them if mounted) or v2 alone.
func cgroupPlacement() (*cgroupPlace, error) {
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	// This process's path in each hierarchy, by its controllers (and
	// name=); the unified hierarchy's by none.
	type entry struct {
		controllers []string
		path        string
	}
	var entries []entry
	for _, line := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 {
			var cs []string
			if f[1] != "" {
				cs = strings.Split(f[1], ",")
			}
			entries = append(entries, entry{cs, f[2]})
		}
	}
	place := &cgroupPlace{}
	for _, line := range strings.Split(string(mounts), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || !strings.HasPrefix(f[4], "/sys/fs/cgroup") || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		if g[0] == "cgroup2" {
			place.v2 = f[4] == "/sys/fs/cgroup"
		}
		opts := strings.Split(g[2], ",")
		path, ok := "", false
		for _, e := range entries {
			v1 := len(e.controllers) > 0
			if v1 == (g[0] == "cgroup") && (!v1 || allIn(e.controllers, opts)) {
				path, ok = e.path, true
				break
			}
		}
		if !ok {
			continue
		}
		// The mount shows the hierarchy from f[3] down.
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(f[3], "/"))
		if !ok {
			return nil, fmt.Errorf("cgroup %s: this process's cgroup %s is not below the mounted %s", f[4], path, f[3])
		}
		place.roots = append(place.roots, f[4])
		place.parents = append(place.parents, filepath.Join(f[4], rel))
	}
	if len(place.parents) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted below /sys/fs/cgroup: the real nodes need one")
	}
	return place, nil
}

// allIn reports whether every one of want is among have.
func allIn(want, have []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// makeNodeCgroups makes node name's cgroup directory in every hierarchy
// (cpuset's with its parent's CPUs and memory nodes; on v2 with the
// controllers handed down to it) and returns them.
func (p *cgroupPlace) makeNodeCgroups(name string) ([]string, error) {
	var dirs []string
	for _, parent := range p.parents {
		d := filepath.Join(parent, nodeCgroupPrefix+strings.TrimPrefix(name, "real-node-"))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", d, err)
		}
		dirs = append(dirs, d)
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err != nil || strings.TrimSpace(string(b)) != "" {
				continue
			}
			b, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
				return nil, fmt.Errorf("cgroup %s: %w", d, err)
			}
		}
		if p.v2 {
			b, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
			if err != nil {
				return nil, err
			}
			var enable []string
			for _, c := range strings.Fields(string(b)) {
				enable = append(enable, "+"+c)
			}
			if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
				return nil, fmt.Errorf("cgroup v2: handing %s down from %s (this process's cgroup) to the real nodes: %w; "+
					"a cgroup that holds processes hands no controller down: run the tests in a delegated cgroup of their own whose processes sit in a leaf", strings.Join(enable, " "), parent, err)
			}
		}
	}
	return dirs, nil
}

// sweepNodeCgroups removes the real nodes' cgroups that a killed run left
// (empty: the kernel killed their processes with the node), below this
// process's cgroups and at the hierarchies' roots; any process still in
// one is killed first.
func sweepNodeCgroups(p *cgroupPlace) {
	for _, d := range p.nodeCgroups() {
		killCgroupProcs(d)
		nodebox.RemoveCgroups(d, nil)
	}
}

// nodeCgroups lists the real nodes' cgroup directories there are, below
// this process's cgroups and at the hierarchies' roots.
func (p *cgroupPlace) nodeCgroups() []string {
	var dirs []string
	for _, parent := range slices.Concat(p.parents, p.roots) {
		d, _ := filepath.Glob(filepath.Join(parent, nodeCgroupPrefix+"*"))
		dirs = append(dirs, d...)
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// killCgroupProcs SIGKILLs every process in cgroup dir and below.
func killCgroupProcs(dir string) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}
