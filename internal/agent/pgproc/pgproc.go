// Package pgproc stops PostgreSQL server processes the way every part of
// chartpilot that runs one does.
package pgproc

import (
	"os/exec"
	"syscall"
	"time"
)

// Stop stops a postgres process with a fast shutdown (SIGINT) and kills
// its process group if it has not ended within 30 s. It waits for cmd.
func Stop(cmd *exec.Cmd) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	Signal(cmd, done)
}

// Signal is Stop for a process whose Wait another goroutine runs: done is
// closed when it has returned.
func Signal(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Process.Kill()
		<-done
	}
}
