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
	_ = cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}
