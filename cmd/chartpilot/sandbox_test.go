//go:build !manager

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func init() {
	// The store helper's sandbox, applied in a child process; then every
	// path of $CHARTPILOT_TEST_READ is opened and the outcome printed.
	probes["sandbox"] = func() int {
		enforced, err := sandboxStoreHelper()
		if err != nil {
			fmt.Println("sandbox:", err)
			return 1
		}
		fmt.Println("enforced:", enforced)
		for _, p := range strings.Split(os.Getenv("CHARTPILOT_TEST_READ"), ",") {
			_, err := os.ReadFile(p)
			fmt.Printf("read %s: %v\n", p, err)
		}
		if err := os.WriteFile("answer", []byte("ok"), 0o600); err != nil {
			fmt.Println("write in its own directory:", err)
		}
		return 0
	}
}

// TestStoreHelperSandbox: once the store helper has limited itself, a
// file such as the manager's ServiceAccount token (here a file beside the
// test's) cannot be read, while the trust store can, and the helper can
// write in its own directory.
func TestStoreHelperSandbox(t *testing.T) {
	if landlockABI() < 1 {
		t.Skip("this kernel has no Landlock: the store helper runs without the file limit here")
	}
	secret := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(secret, []byte("manager-token-never-read"), 0o600); err != nil {
		t.Fatal(err)
	}
	trust := "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(trust); err != nil {
		trust = "/etc/hosts"
	}
	wd := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Dir = wd
	cmd.Env = append(os.Environ(), "CHARTPILOT_TEST_PROBE=sandbox", "CHARTPILOT_TEST_READ="+secret+","+trust)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the probe: %v\n%s", err, out)
	}
	got := string(out)
	if !strings.Contains(got, "enforced: true") {
		t.Fatalf("the limit is not enforced:\n%s", got)
	}
	if !strings.Contains(got, "read "+secret+": open "+secret+": permission denied") {
		t.Errorf("a file outside the helper's reach was read:\n%s", got)
	}
	if !strings.Contains(got, "read "+trust+": <nil>") {
		t.Errorf("the trust store cannot be read:\n%s", got)
	}
	if b, err := os.ReadFile(filepath.Join(wd, "answer")); err != nil || string(b) != "ok" {
		t.Errorf("the helper could not write in its own directory: %v\n%s", err, got)
	}
}
