package backuptest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// Azurite's well-known development account (public, documented by
// Microsoft for the emulator).
const (
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// StartAzure starts Azurite's blob service (bin/azurite, installed by make
// tools) on a loopback port over dir, with one container, "backups",
// stopped when the test ends, and returns the store settings (prefix
// "tenant-a").
func StartAzure(t testpg.T, dir string) backup.Azure {
	t.Helper()
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "azurite", "node_modules", ".bin", "azurite-blob")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: run make tools (it installs Azurite)", bin)
	}
	port := testpg.FreePort(t)
	a := backup.Azure{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/%s", port, azuriteAccount), AccountName: azuriteAccount,
		Container: "backups", Prefix: "tenant-a", AccountKey: azuriteKey}
	logPath := filepath.Join(dir, "azurite.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--blobHost", "127.0.0.1", "--blobPort", fmt.Sprint(port), "--location", dir, "--skipApiVersionCheck", "--silent")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait(); log.Close() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("Azurite not answering: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cred, err := container.NewSharedKeyCredential(a.AccountName, a.AccountKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := container.NewClientWithSharedKeyCredential(a.Endpoint+"/"+a.Container, cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(context.Background(), nil); err != nil {
		t.Fatalf("creating container %s in Azurite: %v", a.Container, err)
	}
	return a
}
