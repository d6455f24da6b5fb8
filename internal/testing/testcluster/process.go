package testcluster

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/nodebox"
)

// process is one control-plane component started by the cluster (envtest
// starts etcd and kube-apiserver itself). Its output goes to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	err     error
	// grace is how long Stop waits after SIGTERM (default 15 s).
	grace time.Duration
}

// startProcess starts bin with args, writing stdout and stderr to
// logDir/<name>.log. The child gets SIGKILL when this process dies
// (Pdeathsig), so a test that panics leaves no component behind.
func startProcess(name, bin string, args []string, logDir string) (*process, error) {
	return startProcessEnv(name, bin, args, logDir, nil)
}

// startProcessEnv is startProcess with env added to this process's.
func startProcessEnv(name, bin string, args []string, logDir string, env []string) (*process, error) {
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return startCmd(name, cmd, logDir)
}

// startCmd starts cmd as the component name, its output to
// logDir/<name>.log.
func startCmd(name string, cmd *exec.Cmd, logDir string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	cmd.Stdout = f
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to grace, then kills the process group
// (or the process, when it leads none: a real node's init).
func (p *process) stop(grace time.Duration) {
	if ok, _ := p.exited(); ok {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// openLog opens logDir/<name>.log for a component of this process.
func openLog(logDir, name string) io.Writer {
	f, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return io.Discard
	}
	return f
}

// tailFile returns the last n lines of the file at path, for error messages.
func tailFile(path string, n int) string { return nodebox.Tail(path, n) }

// watchdog is a tiny shell process that outlives a crashed test binary long
// enough to kill the process groups registered with it. envtest starts etcd
// and kube-apiserver in process groups of their own without a parent-death
// signal, so without it a panicking test would orphan them. The watchdog
// learns process group ids line by line on its stdin; when stdin closes
// (our process died, or Stop is done) it kills whatever is left of them.
type watchdog struct {
	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser
	known map[int]bool
}

// After the kills and clean-ups it trims each working directory it was
// told of to its logs: a test binary killed from outside (or a failed run,
// whose directory Stop keeps) leaves its logs, not gigabytes of etcd data,
// images and volumes. A directory with anything still mounted under it is
// left whole, and rm never crosses into another file system.
const watchdogScript = `pids=""
cleanups=""
dirs=""
while read -r line; do
	case "$line" in
	"cleanup "*) cleanups="$cleanups ${line#cleanup }" ;;
	"dir "*) dirs="$dirs ${line#dir }" ;;
	*) pids="$pids $line" ;;
	esac
done
for p in $pids; do kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
for s in $cleanups; do /bin/sh "$s" >/dev/null 2>&1; done
for d in $dirs; do
	[ -d "$d" ] || continue
	grep -q " $d/" /proc/self/mountinfo && continue
	for e in "$d"/* "$d"/.[!.]*; do
		[ -e "$e" ] || continue
		[ "$e" = "$d/logs" ] && continue
		rm -rf --one-file-system "$e" 2>/dev/null
	done
done
exit 0`

func startWatchdog() (*watchdog, error) {
	cmd := exec.Command("/bin/sh", "-c", watchdogScript)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// A process group of its own, so a Ctrl-C to the test's group does not
	// kill the watchdog before it has done its job.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting watchdog: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	return &watchdog{cmd: cmd, stdin: stdin, known: map[int]bool{}}, nil
}

// register tells the watchdog about a process (group) to kill if we die.
func (w *watchdog) register(pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.known[pid] || pid == w.cmd.Process.Pid {
		return
	}
	w.known[pid] = true
	_, _ = fmt.Fprintf(w.stdin, "%d\n", pid)
}

// cleanup tells the watchdog about a shell script to run after the kills
// (tear-down of what killed processes leave: mounts, interfaces).
func (w *watchdog) cleanup(script string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = fmt.Fprintf(w.stdin, "cleanup %s\n", script)
}

// trimOnExit tells the watchdog about a temporary working directory to
// trim to its logs when it exits (see watchdogScript). The path must hold
// no white space; os.MkdirTemp's under the default temporary directory
// does not.
func (w *watchdog) trimOnExit(dir string) {
	if strings.ContainsAny(dir, " \t\n") {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = fmt.Fprintf(w.stdin, "dir %s\n", dir)
}

// registerChildren registers every direct child of this process, which is
// how the processes envtest started are found.
func (w *watchdog) registerChildren() {
	for _, pid := range childPIDs() {
		w.register(pid)
	}
}

// close makes the watchdog kill what is left of the registered processes and exit.
func (w *watchdog) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.stdin.Close()
}

// childPIDs lists the direct children of this process from /proc.
func childPIDs() []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	var pids []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
