// Package hoststate records the parts of a machine that running the real
// nodes could change, so that a test or CI can compare the machine before
// and after: kernel tunables, iptables rules, routes, links, addresses,
// mounts, network namespaces, the nodes' cgroups and any process of the
// nodes' programs or of another PID namespace.
package hoststate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/nodebox"
)

// State is, per section, the lines that describe it (sorted; a line may
// repeat).
type State map[string][]string

// Sections names what Take records, in the order Diff reports it.
var Sections = []string{"sysctl", "iptables", "routes", "links", "addresses", "mounts", "netns", "cgroups", "processes"}

// programs are the binaries of the real nodes: one still running after a
// cluster stopped is one it left behind.
var programs = []string{"nodeinit", "containerd", "containerd-shim-runc-v2", "runc", "kubelet", "kube-proxy", "coredns", "podutil", "pause"}

// Take records the machine as this process sees it.
func Take() (State, error) {
	s := State{}
	for _, f := range []func(State) error{sysctls, iptables, routes, links, mounts, netns, cgroups, processes} {
		if err := f(s); err != nil {
			return nil, err
		}
	}
	for k := range s {
		sort.Strings(s[k])
	}
	return s, nil
}

// Summary says how much each section holds, as "section N" pairs.
func (s State) Summary() string {
	var b strings.Builder
	for _, k := range Sections {
		fmt.Fprintf(&b, "%s %d, ", k, len(s[k]))
	}
	return strings.TrimSuffix(b.String(), ", ")
}

// Diff lists what after has that before had not ("+ section: line") and
// the reverse ("- section: line").
func Diff(before, after State) []string {
	var out []string
	for _, k := range Sections {
		count := map[string]int{}
		for _, l := range before[k] {
			count[l]--
		}
		for _, l := range after[k] {
			count[l]++
		}
		keys := make([]string, 0, len(count))
		for l := range count {
			keys = append(keys, l)
		}
		sort.Strings(keys)
		for _, l := range keys {
			for n := count[l]; n > 0; n-- {
				out = append(out, "+ "+k+": "+l)
			}
			for n := count[l]; n < 0; n++ {
				out = append(out, "- "+k+": "+l)
			}
		}
	}
	return out
}

// Swept tells whether a difference is the removal of a real node's cgroup
// directory that a killed run left: every start of real nodes removes
// those, so a later record may lack what an earlier one had.
func Swept(diff string) bool {
	return strings.HasPrefix(diff, "- cgroups: ") && strings.Contains(diff, "/chartpilot-real-node-")
}

func sysctls(s State) error {
	paths := []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/bridge/bridge-nf-call-iptables"}
	for p := range nodebox.KernelTunables() {
		paths = append(paths, p)
	}
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join("/proc/sys", p))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		s["sysctl"] = append(s["sysctl"], p+"="+strings.TrimSpace(string(b)))
	}
	return nil
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// iptables records the rules of every iptables back end there is.
func iptables(s State) error {
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		out, err := exec.Command(tool).Output()
		if err != nil {
			return fmt.Errorf("%s: %w", tool, err)
		}
		for _, l := range lines(string(out)) {
			if !strings.HasPrefix(l, "#") {
				s["iptables"] = append(s["iptables"], tool+": "+counters.ReplaceAllString(l, "[counters]"))
			}
		}
	}
	return nil
}

var expires = regexp.MustCompile(` expires -?\d+sec`)

func routes(s State) error {
	for _, family := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", family, "route", "show", "table", "all").Output()
		if err != nil {
			return fmt.Errorf("ip %s route: %w", family, err)
		}
		for _, l := range lines(string(out)) {
			s["routes"] = append(s["routes"], family+" "+expires.ReplaceAllString(l, ""))
		}
	}
	return nil
}

func links(s State) error {
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		return fmt.Errorf("ip link: %w", err)
	}
	for _, l := range lines(string(out)) {
		if f := strings.Fields(l); len(f) > 1 {
			s["links"] = append(s["links"], strings.TrimSuffix(f[1], ":"))
		}
	}
	out, err = exec.Command("ip", "-o", "addr", "show").Output()
	if err != nil {
		return fmt.Errorf("ip addr: %w", err)
	}
	for _, l := range lines(string(out)) {
		if f := strings.Fields(l); len(f) > 3 {
			s["addresses"] = append(s["addresses"], f[1]+" "+f[2]+" "+f[3])
		}
	}
	return nil
}

func mounts(s State) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, l := range lines(string(b)) {
		pre, post, _ := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) > 4 && len(g) > 1 {
			s["mounts"] = append(s["mounts"], f[4]+" "+g[0]+" "+g[1])
		}
	}
	return nil
}

func netns(s State) error {
	for _, d := range []string{"/run/netns", "/var/run/netns"} {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			s["netns"] = append(s["netns"], filepath.Join(d, e.Name()))
		}
	}
	return nil
}

// cgroups records every cgroup directory named like the real nodes' or
// the kubelet's.
func cgroups(s State) error {
	return filepath.WalkDir("/sys/fs/cgroup", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if name := d.Name(); strings.HasPrefix(name, "chartpilot") || strings.HasPrefix(name, "kubepods") {
			s["cgroups"] = append(s["cgroups"], path)
		}
		return nil
	})
}

// processes records the processes of the nodes' programs and those of
// any PID namespace but this process's (containers), by executable.
func processes(s State) error {
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return err
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join(p, "exe"))
		if err != nil {
			continue // a kernel thread, or gone
		}
		ns, _ := os.Readlink(filepath.Join(p, "ns", "pid"))
		switch {
		case ns != own:
			s["processes"] = append(s["processes"], ns+" "+exe)
		case slices.Contains(programs, filepath.Base(strings.TrimSuffix(exe, " (deleted)"))):
			s["processes"] = append(s["processes"], exe)
		}
	}
	return nil
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
