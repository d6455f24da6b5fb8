package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// script is an executable shell script standing in for the helper.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStoreHelperAnswers: what the manager makes of its helper's answers.
// The credentials given never come back in a reply or an error, whatever
// the helper prints; an output that is not an answer is an error; the
// request reaches the helper on its standard input, not its command line.
func TestStoreHelperAnswers(t *testing.T) {
	const secret = "secret-never-shown-0123456789"
	req := StoreRequest{Op: "probe", S3: &S3{Bucket: "b", AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: secret}}
	ctx := context.Background()

	args := filepath.Join(t.TempDir(), "args")
	h := NewStoreHelper(script(t, `echo "$@" > `+args+`; grep -q '"op":"probe"' && printf '{"done":true,"failed":"denied for %s"}' `+secret))
	r, err := h.Do(ctx, "ns", req)
	if err != nil || !strings.Contains(r.Failed, "denied for [redacted]") || strings.Contains(r.Failed, secret) {
		t.Errorf("reply %+v, %v: want the failure with the secret scrubbed", r, err)
	}
	if got, _ := os.ReadFile(args); strings.TrimSpace(string(got)) != "store" {
		t.Errorf("the helper's arguments: %q, want only store", got)
	}

	h = NewStoreHelper(script(t, `echo "cannot use `+secret+`" >&2; exit 3`))
	if _, err := h.Do(ctx, "ns", req); err == nil || !strings.Contains(err.Error(), "gave no answer") || strings.Contains(err.Error(), secret) {
		t.Errorf("a helper that fails: %v", err)
	}
	h = NewStoreHelper(script(t, `echo '{"failed":""}'`))
	if _, err := h.Do(ctx, "ns", req); err == nil || !strings.Contains(err.Error(), "gave no answer") {
		t.Errorf("an output without done: %v, want no answer", err)
	}
	h = NewStoreHelper(filepath.Join(t.TempDir(), "missing"))
	if _, err := h.Do(ctx, "ns", req); err == nil || !strings.Contains(err.Error(), "gave no answer") {
		t.Errorf("a missing helper: %v", err)
	}
	if _, err := (*StoreHelper)(nil).Do(ctx, "ns", req); err == nil || !strings.Contains(err.Error(), "--store-helper") {
		t.Errorf("no helper: %v", err)
	}

	// A helper that hangs is stopped at the context's end.
	h = NewStoreHelper(script(t, `exec sleep 60`))
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := h.Do(short, "ns", req); err == nil {
		t.Errorf("a helper that never answers: no error")
	}
}

// TestStoreHelperFairShare: a namespace's slow stores hold one helper
// slot; its other requests are answered ErrBusy at once (nothing runs),
// while another namespace's request runs and is answered; no more than
// Parallel helpers run in all.
func TestStoreHelperFairShare(t *testing.T) {
	dir := t.TempDir()
	running, counts := filepath.Join(dir, "running"), filepath.Join(dir, "counts")
	if err := os.Mkdir(running, 0o755); err != nil {
		t.Fatal(err)
	}
	h := NewStoreHelper(script(t, `touch `+running+`/$$; ls `+running+` | wc -l >> `+counts+`
if grep -q slow; then sleep 3; fi
rm `+running+`/$$; printf '{"done":true}'`))
	h.Parallel = 3
	slow := StoreRequest{Op: "probe", S3: &S3{Bucket: "slow"}}
	fast := StoreRequest{Op: "probe", S3: &S3{Bucket: "fast"}}
	first := make(chan error, 1)
	go func() {
		_, err := h.Do(context.Background(), "tenant-a", slow)
		first <- err
	}()
	// Wait until tenant-a's first request holds its slot.
	if !testwait.Until(time.Minute, 20*time.Millisecond, func() bool { entries, _ := os.ReadDir(running); return len(entries) == 1 }) {
		t.Fatal("the first helper never started")
	}
	for range 3 {
		if _, err := h.Do(context.Background(), "tenant-a", slow); !errors.Is(err, ErrBusy) {
			t.Fatalf("a second request of the same namespace: %v, want ErrBusy", err)
		}
	}
	// tenant-b is answered while tenant-a's slow store still runs.
	if _, err := h.Do(context.Background(), "tenant-b", fast); err != nil {
		t.Fatalf("another namespace's request: %v", err)
	}
	if entries, _ := os.ReadDir(running); len(entries) != 1 {
		t.Fatalf("tenant-a's helper ended before tenant-b was answered (%d running): the test shows nothing", len(entries))
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The bound in all: Parallel namespaces at once, the next one busy.
	h.Timeout = time.Minute
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			_, err := h.Do(context.Background(), fmt.Sprintf("tenant-%d", i), slow)
			errs <- err
		}()
	}
	busy := 0
	for range 4 {
		if err := <-errs; errors.Is(err, ErrBusy) {
			busy++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if busy != 1 {
		t.Errorf("%d of 4 namespaces found no slot, want 1 (Parallel 3)", busy)
	}
	data, err := os.ReadFile(counts)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Fields(string(data)) {
		if n, _ := strconv.Atoi(l); n > 3 {
			t.Errorf("%d helpers ran at once, want at most 3", n)
		}
	}
}

// TestStoreHelperIsolated: the helper runs with none of the manager's
// environment, in a directory of its own that is gone afterwards; an
// answer larger than MaxReply is refused without being held (the
// manager's memory grows by far less than the 100 MiB written), and a
// manifest whose fields are not a manifest's is refused.
func TestStoreHelperIsolated(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "manager-secret-never-passed")
	t.Setenv("SSL_CERT_DIR", "/etc/ssl/certs")
	out := filepath.Join(t.TempDir(), "seen")
	h := NewStoreHelper(script(t, `env > `+out+`.env; pwd > `+out+`.pwd; printf '{"done":true}'`))
	if _, err := h.Do(context.Background(), "ns", StoreRequest{Op: "probe"}); err != nil {
		t.Fatal(err)
	}
	env, _ := os.ReadFile(out + ".env")
	for _, leaked := range []string{"KUBERNETES_SERVICE_HOST", "manager-secret-never-passed", "PATH=" + os.Getenv("PATH")} {
		if strings.Contains(string(env), leaked) {
			t.Errorf("the helper's environment holds %s:\n%s", leaked, env)
		}
	}
	if !strings.Contains(string(env), "SSL_CERT_DIR=/etc/ssl/certs") {
		t.Errorf("the trust store setting did not reach the helper:\n%s", env)
	}
	pwd, _ := os.ReadFile(out + ".pwd")
	wd := strings.TrimSpace(string(pwd))
	if !strings.Contains(wd, "chartpilot-store-") || !strings.Contains(string(env), "HOME="+wd) {
		t.Errorf("the helper ran in %q (HOME in %q), not a directory of its own", wd, env)
	}
	if _, err := os.Stat(wd); !os.IsNotExist(err) {
		t.Errorf("the helper's directory %s is still there: %v", wd, err)
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h = NewStoreHelper(script(t, `printf '{"done":true,"manifest":{"format":"chartpilot.dev/backup/v1","sha256":"'; head -c 104857600 /dev/zero | tr '\0' a; printf '"}}'`))
	if _, err := h.Do(context.Background(), "ns", StoreRequest{Op: "manifest"}); err == nil || !strings.Contains(err.Error(), "answered more than") {
		t.Errorf("a 100 MiB answer: %v", err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 50<<20 {
		t.Errorf("reading a 100 MiB answer allocated %d MiB", grew>>20)
	} else {
		t.Logf("reading a 100 MiB answer allocated %.1f MiB", float64(grew)/(1<<20))
	}
	h = NewStoreHelper(script(t, `printf '{"done":true,"manifest":{"format":"chartpilot.dev/backup/v1","sha256":"%s","compression":"zstd"}}' $(head -c 4000 /dev/zero | tr '\0' f)`))
	if _, err := h.Do(context.Background(), "ns", StoreRequest{Op: "manifest"}); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("a manifest with a 4000-digit sha256: %v", err)
	}
}
