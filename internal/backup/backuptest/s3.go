// Package backuptest starts the S3 server the backup tests and the
// benchmark store to: versitygw (bin/versitygw, built by make tools) on a
// loopback port over a directory.
package backuptest

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// StartS3 starts versitygw with one bucket, "backups", under dir, stopped
// when the test ends, and returns the store settings (prefix "tenant-a").
// The credentials reach the server through its environment.
func StartS3(t testpg.T, dir string) backup.S3 {
	t.Helper()
	return StartS3On(t, dir, "127.0.0.1")
}

// StartS3On is StartS3 listening on host (an address of this machine:
// testcluster.HostIP, for the real nodes' pods to reach).
func StartS3On(t testpg.T, dir, host string) backup.S3 {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "versitygw")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: run make tools (it builds the S3 server the backup tests store to)", bin)
	}
	for _, d := range []string{"data/backups", "meta"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port := testpg.FreePort(t)
	s := backup.S3{Endpoint: "http://" + net.JoinHostPort(host, strconv.Itoa(port)), Bucket: "backups", Prefix: "tenant-a", ForcePathStyle: true,
		AccessKeyID: "chartpilot-test", SecretAccessKey: "s3-secret-never-shown-0123456789"}
	logPath := filepath.Join(dir, "versitygw.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--port", net.JoinHostPort(host, strconv.Itoa(port)), "--quiet", "posix", "--sidecar", filepath.Join(dir, "meta"), filepath.Join(dir, "data"))
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKeyID, "ROOT_SECRET_ACCESS_KEY="+s.SecretAccessKey)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); log.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint)
		if err == nil {
			resp.Body.Close()
			return s
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("versitygw not answering: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
