// Package nodebox is the init of a real node of the local cluster: PID 1 of
// a PID namespace of its own, with its own mount, network, UTS, IPC and
// cgroup namespaces, that starts the node's containerd, kubelet and
// kube-proxy and keeps them.
//
// Whatever a node does stays in the box. When the init dies, for any
// reason (SIGKILL included), the kernel kills every process of its PID
// namespace, pods and containerd's shims among them; the mounts they made
// (overlay snapshots, projected-volume tmpfs, netns bind mounts) go with
// its mount namespace; its bridge, veths, routes, iptables rules and
// per-namespace settings go with its network namespace. The kubelet's
// machine-wide kernel tunables are answered by files bind-mounted over
// their /proc/sys entries in the node's mount namespace, so the host's are
// never written. The only thing the kernel leaves is the node's cgroup
// directories, empty: the init removes those below its own on a tidy stop,
// and the cluster's next start removes any a killed run left.
//
// The cluster (package testcluster) starts the init with the namespaces
// made by clone(2) and a parent-death signal, writes one line to its stdin
// once the node's link to the host exists, and stops it with SIGTERM.
package nodebox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
)

// Config is what an init does, written by the cluster as JSON.
type Config struct {
	// Name is the node's name, and its host name.
	Name string
	// Dir is the node's directory: the tunables' files go to Dir/sysctl.
	Dir string
	// Cgroups are the node's cgroup directories on the host, one per
	// hierarchy: the init moves itself there, then starts a cgroup
	// namespace rooted there, so the node's "/" is below the cgroup of
	// the process that started the cluster.
	Cgroups []string
	// CgroupV2 is set on a host with the unified hierarchy only.
	CgroupV2 bool
	// Tmpfs are directories covered with an empty tmpfs in the node (where
	// the node's programs write to fixed host paths: /run, /var/log).
	Tmpfs []string
	// IP is run in order in the node's network namespace, each as the
	// arguments of ip(8), once the host has made the node's link.
	IP [][]string
	// NetSysctls are written in the node's network namespace (paths
	// below /proc/sys).
	NetSysctls map[string]string
	// Procs are started in order and kept running: the node stops when
	// one exits.
	Procs []Proc
	// LogDir receives NAME-PROC.log for each process.
	LogDir string
}

// Proc is one program of the node.
type Proc struct {
	Name string
	Path string
	Args []string
	Env  []string
	// WaitFile, when set, must exist before the program starts (the
	// kubelet waits for containerd's socket).
	WaitFile string
}

// KernelTunables are the machine-wide settings the pinned kubelet checks
// (setupKernelTunables in pkg/kubelet/cm, with protectKernelDefaults) and
// otherwise writes, paths below /proc/sys, with the values it wants: the
// node answers them with files of its own, the host's are never touched.
func KernelTunables() map[string]string {
	return map[string]string{
		utilsysctl.VMOvercommitMemory: strconv.Itoa(utilsysctl.VMOvercommitMemoryAlways),
		utilsysctl.VMPanicOnOOM:       strconv.Itoa(utilsysctl.VMPanicOnOOMInvokeOOMKiller),
		utilsysctl.KernelPanic:        strconv.Itoa(utilsysctl.KernelPanicRebootTimeout),
		utilsysctl.KernelPanicOnOops:  strconv.Itoa(utilsysctl.KernelPanicOnOopsAlways),
		utilsysctl.RootMaxKeys:        strconv.Itoa(utilsysctl.RootMaxKeysSetting),
		utilsysctl.RootMaxBytes:       strconv.Itoa(utilsysctl.RootMaxBytesSetting),
	}
}

// Cloneflags are the namespaces the cluster starts an init in; the cgroup
// namespace the init starts itself, once in its cgroups.
const Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC

// stageEnv marks the init re-executed in its cgroup namespace.
const stageEnv = "CHARTPILOT_NODEBOX_STAGE"

// Main runs the init with the configuration file named by its argument.
// It does not return.
func Main() {
	// Namespaces made by unshare(2) belong to the calling thread: keep the
	// main goroutine on the main thread, which exec(2) keeps.
	runtime.LockOSThread()
	log := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000")+" nodebox: "+format+"\n", args...)
	}
	if len(os.Args) != 2 {
		log("usage: nodeinit CONFIG.json")
		os.Exit(2)
	}
	b, err := os.ReadFile(os.Args[1])
	if err != nil {
		log("%v", err)
		os.Exit(2)
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		log("%s: %v", os.Args[1], err)
		os.Exit(2)
	}
	if os.Getpid() != 1 {
		log("not PID 1 of a PID namespace of its own: started without the node's namespaces")
		os.Exit(2)
	}
	if os.Getenv(stageEnv) == "" {
		if err := enterCgroups(cfg); err != nil {
			log("%v", err)
			os.Exit(1)
		}
		// Not reached.
	}
	n := &node{cfg: cfg, log: log, procs: map[int]*Proc{}}
	os.Exit(n.run())
}

// enterCgroups moves the init into the node's cgroups, starts a cgroup
// namespace rooted there and executes the init again in it.
func enterCgroups(cfg Config) error {
	for _, d := range cfg.Cgroups {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte("0"), 0o644); err != nil {
			return fmt.Errorf("moving into the node's cgroup %s: %w", d, err)
		}
	}
	if err := syscall.Unshare(syscall.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(self, os.Args, append(os.Environ(), stageEnv+"=2"))
}

type node struct {
	cfg   Config
	log   func(string, ...any)
	procs map[int]*Proc
	// hierarchies are the node's cgroup mounts (its own view).
	hierarchies []string
}

func (n *node) run() int {
	if err := n.mounts(); err != nil {
		n.log("%v", err)
		return 1
	}
	if err := syscall.Sethostname([]byte(n.cfg.Name)); err != nil {
		n.log("host name: %v", err)
		return 1
	}
	// The host makes the node's link, then says so.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		n.log("waiting for the host: %v", err)
		return 1
	}
	if err := n.network(); err != nil {
		n.log("%v", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for i := range n.cfg.Procs {
		p := &n.cfg.Procs[i]
		if err := n.start(p); err != nil {
			n.log("%v", err)
			n.teardown()
			return 1
		}
	}
	n.log("node %s running", n.cfg.Name)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			n.log("%v: stopping", s)
			n.teardown()
			return 0
		}
		if p := n.reap(); p != nil {
			n.log("%s exited; stopping the node (last lines of its log:)\n%s", p.Name, Tail(n.logPath(p), 15))
			n.teardown()
			return 1
		}
	}
	return 1
}

// mounts makes the node's view of the machine: nothing mounted here is
// seen by the host (slave propagation), a /proc of the node's PID
// namespace with the kernel tunables answered, a /sys of its network
// namespace with its cgroup hierarchies, and empty /run and /var/log.
func (n *node) mounts() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making / a slave mount: %w", err)
	}
	cgroups, err := cgroupMounts()
	if err != nil {
		return err
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	dir := filepath.Join(n.cfg.Dir, "sysctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for path, v := range KernelTunables() {
		f := filepath.Join(dir, strings.ReplaceAll(path, "/", "."))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o444); err != nil {
			return err
		}
		if err := syscall.Mount(f, filepath.Join("/proc/sys", path), "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("answering %s in the node: %w", path, err)
		}
		// Read-only: a program that writes it gets an error, not the host.
		if err := syscall.Mount("", filepath.Join("/proc/sys", path), "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("answering %s in the node: %w", path, err)
		}
	}
	if err := syscall.Mount("sysfs", "/sys", "sysfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /sys: %w", err)
	}
	if err := n.mountCgroups(cgroups); err != nil {
		return err
	}
	for _, d := range n.cfg.Tmpfs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			continue
		}
		if err := syscall.Mount("tmpfs", d, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", d, err)
		}
	}
	return nil
}

// cgroupMount is one cgroup hierarchy mounted on the host.
type cgroupMount struct {
	dir, fstype, options string
	// links are the host's symbolic links to it (cpu -> cpu,cpuacct).
	links []string
}

// cgroupMounts reads the host's cgroup mounts below /sys/fs/cgroup.
func cgroupMounts() ([]cgroupMount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []cgroupMount
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") || !strings.HasPrefix(f[4], "/sys/fs/cgroup") {
			continue
		}
		m := cgroupMount{dir: f[4], fstype: g[0]}
		if g[0] == "cgroup" {
			// The hierarchy's controllers (and name=), without rw/ro.
			var opts []string
			for _, o := range strings.Split(g[2], ",") {
				if o != "rw" && o != "ro" {
					opts = append(opts, o)
				}
			}
			m.options = strings.Join(opts, ",")
		}
		out = append(out, m)
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink(filepath.Join("/sys/fs/cgroup", e.Name()))
		if err != nil {
			continue
		}
		for i := range out {
			if filepath.Base(out[i].dir) == filepath.Base(target) {
				out[i].links = append(out[i].links, e.Name())
			}
		}
	}
	return out, nil
}

// mountCgroups mounts the hierarchies again in the node: in its cgroup
// namespace they show the node's cgroup as their root.
func (n *node) mountCgroups(cgroups []cgroupMount) error {
	if n.cfg.CgroupV2 {
		if err := syscall.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mounting cgroup2: %w", err)
		}
		n.hierarchies = []string{"/sys/fs/cgroup"}
		return n.cgroupV2Leaf()
	}
	if err := syscall.Mount("tmpfs", "/sys/fs/cgroup", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "mode=755"); err != nil {
		return fmt.Errorf("tmpfs on /sys/fs/cgroup: %w", err)
	}
	for _, m := range cgroups {
		if m.dir == "/sys/fs/cgroup" {
			continue
		}
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount("cgroup", m.dir, m.fstype, syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, m.options); err != nil {
			return fmt.Errorf("mounting cgroup %s (%s): %w", m.dir, m.options, err)
		}
		n.hierarchies = append(n.hierarchies, m.dir)
		for _, l := range m.links {
			if err := os.Symlink(filepath.Base(m.dir), filepath.Join("/sys/fs/cgroup", l)); err != nil {
				return err
			}
		}
	}
	return nil
}

// cgroupV2Leaf moves the node's own processes into a leaf (/init) and
// hands the controllers of the node's root to its children: in the
// unified hierarchy a cgroup with processes has no child with controllers.
func (n *node) cgroupV2Leaf() error {
	if err := os.MkdirAll("/sys/fs/cgroup/init", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile("/sys/fs/cgroup/init/cgroup.procs", []byte("0"), 0o644); err != nil {
		return fmt.Errorf("moving into /init: %w", err)
	}
	b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(b)) {
		enable = append(enable, "+"+c)
	}
	if len(enable) == 0 {
		return errors.New("cgroup v2: the node's cgroup has no controllers (the host's cgroup above it does not hand them down)")
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644); err != nil {
		return fmt.Errorf("cgroup v2: enabling %s for the pods: %w", strings.Join(enable, " "), err)
	}
	return nil
}

// network configures the node's network namespace.
func (n *node) network() error {
	for _, args := range n.cfg.IP {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for path, v := range n.cfg.NetSysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", path), []byte(v), 0o644); err != nil {
			return fmt.Errorf("%s in the node: %w", path, err)
		}
	}
	return nil
}

func (n *node) logPath(p *Proc) string {
	return filepath.Join(n.cfg.LogDir, n.cfg.Name+"-"+p.Name+".log")
}

// start starts p, after its WaitFile exists.
func (n *node) start(p *Proc) error {
	if p.WaitFile != "" {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if _, err := os.Stat(p.WaitFile); err == nil {
				break
			}
			if ended := n.reap(); ended != nil {
				return fmt.Errorf("%s exited before %s was there (last lines of its log:)\n%s", ended.Name, p.WaitFile, Tail(n.logPath(ended), 15))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: %s did not appear", p.Name, p.WaitFile)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	f, err := os.OpenFile(n.logPath(p), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	n.procs[cmd.Process.Pid] = p
	return nil
}

// reap collects every child that ended (the init's own, and orphans that
// came to it: containerd's shims), returning one of the node's programs
// among them.
func (n *node) reap() *Proc {
	var ended *Proc
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return ended
		}
		if p := n.procs[pid]; p != nil {
			delete(n.procs, pid)
			ended = p
		}
	}
}

// teardown stops the node's programs (SIGTERM, then SIGKILL to every
// process of the node), reaps them and removes the cgroups below the
// node's own.
func (n *node) teardown() {
	for pid := range n.procs {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(n.procs) > 0 && time.Now().Before(deadline) {
		n.reap()
		time.Sleep(50 * time.Millisecond)
	}
	// Every other process of the PID namespace: pods, shims.
	_ = syscall.Kill(-1, syscall.SIGKILL)
	deadline = time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.ECHILD) {
			break
		}
		if pid <= 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := 0; i < 50; i++ {
		left := 0
		for _, h := range n.hierarchies {
			// All but the node's own: the host removes it once the init
			// is gone (and on cgroup v2, the init's leaf).
			left += RemoveCgroups(h, func(path string) bool {
				return path == h || (n.cfg.CgroupV2 && path == filepath.Join(h, "init"))
			})
		}
		if left == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RemoveCgroups removes the cgroup directory root and every one below it,
// deepest first, but those keep names; it returns how many are left (a
// cgroup that still holds a process cannot be removed).
func RemoveCgroups(root string, keep func(string) bool) int {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && (keep == nil || !keep(path)) {
			dirs = append(dirs, path)
		}
		return nil
	})
	slices.Reverse(dirs)
	left := 0
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			left++
		}
	}
	return left
}

// Tail returns the last n lines of the file at path, for error messages.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
