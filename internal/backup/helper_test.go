package backup

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
	r, err := h.Do(ctx, req)
	if err != nil || !strings.Contains(r.Failed, "denied for [redacted]") || strings.Contains(r.Failed, secret) {
		t.Errorf("reply %+v, %v: want the failure with the secret scrubbed", r, err)
	}
	if got, _ := os.ReadFile(args); strings.TrimSpace(string(got)) != "store" {
		t.Errorf("the helper's arguments: %q, want only store", got)
	}

	h = NewStoreHelper(script(t, `echo "cannot use `+secret+`" >&2; exit 3`))
	if _, err := h.Do(ctx, req); err == nil || !strings.Contains(err.Error(), "gave no answer") || strings.Contains(err.Error(), secret) {
		t.Errorf("a helper that fails: %v", err)
	}
	h = NewStoreHelper(script(t, `echo '{"failed":""}'`))
	if _, err := h.Do(ctx, req); err == nil || !strings.Contains(err.Error(), "gave no answer") {
		t.Errorf("an output without done: %v, want no answer", err)
	}
	h = NewStoreHelper(filepath.Join(t.TempDir(), "missing"))
	if _, err := h.Do(ctx, req); err == nil || !strings.Contains(err.Error(), "gave no answer") {
		t.Errorf("a missing helper: %v", err)
	}
	if _, err := (*StoreHelper)(nil).Do(ctx, req); err == nil || !strings.Contains(err.Error(), "--store-helper") {
		t.Errorf("no helper: %v", err)
	}

	// A helper that hangs is stopped at the context's end.
	h = NewStoreHelper(script(t, `exec sleep 60`))
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := h.Do(short, req); err == nil {
		t.Errorf("a helper that never answers: no error")
	}
}

// TestStoreHelperBound: no more than DefaultHelperParallel helpers run at
// once, however many checks ask; the others wait and are answered.
func TestStoreHelperBound(t *testing.T) {
	dir := t.TempDir()
	running, counts := filepath.Join(dir, "running"), filepath.Join(dir, "counts")
	if err := os.Mkdir(running, 0o755); err != nil {
		t.Fatal(err)
	}
	h := NewStoreHelper(script(t, `touch `+running+`/$$; ls `+running+` | wc -l >> `+counts+`; sleep 0.3; rm `+running+`/$$; printf '{"done":true}'`))
	errs := make(chan error, 12)
	for range 12 {
		go func() {
			_, err := h.Do(context.Background(), StoreRequest{Op: "probe", S3: &S3{Bucket: "b"}})
			errs <- err
		}()
	}
	for range 12 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(counts)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(data))
	if len(lines) != 12 {
		t.Fatalf("%d helpers ran, want 12", len(lines))
	}
	for _, l := range lines {
		if n, _ := strconv.Atoi(l); n > DefaultHelperParallel {
			t.Errorf("%d helpers ran at once, want at most %d", n, DefaultHelperParallel)
		}
	}
}
