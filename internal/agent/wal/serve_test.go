package wal_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gocloud.dev/blob/memblob"

	"github.com/chartpilot/chartpilot/internal/agent/wal"
)

// TestServiceArchivesForTheServer: wal-push and wal-fetch --via ask the
// WAL service, which holds the store: a segment pushed through it is
// stored, fetched back through it whole, a missing one is "not found"
// (restore_command's exit status 1), and no path outside the data
// directory is read or written.
func TestServiceArchivesForTheServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	const seg = 1 << 20
	a := &wal.Archive{Bucket: b, Prefix: "ns/db", SegmentSize: seg, Retries: -1}
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "pg_wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	const name = "000000010000000000000003"
	segment := bytes.Repeat([]byte("wal!"), seg/4)
	if err := os.WriteFile(filepath.Join(data, "pg_wal", name), segment, 0o600); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "wal.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged []string
	svc := &wal.Service{Archive: a, DataDir: data, Parallel: 2, Log: func(op, n string, err error) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, op+" "+n)
	}}
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, l) }()

	if err := wal.Ask(ctx, socket, wal.Request{Op: "push", Path: filepath.Join(data, "pg_wal", name)}); err != nil {
		t.Fatalf("push: %v", err)
	}
	if names, err := a.List(ctx); err != nil || len(names) != 1 || names[0] != name {
		t.Fatalf("stored after the push: %v, %v", names, err)
	}
	dest := filepath.Join(data, "pg_wal", "RECOVERYXLOG")
	if err := wal.Ask(ctx, socket, wal.Request{Op: "fetch", Name: name, Path: dest}); err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if got, err := os.ReadFile(dest); err != nil || !bytes.Equal(got, segment) {
		t.Fatalf("fetched %d bytes (%v), want the %d pushed", len(got), err, len(segment))
	}
	err = wal.Ask(ctx, socket, wal.Request{Op: "fetch", Name: "000000010000000000000009", Path: dest})
	if !errors.Is(err, wal.ErrNotFound) {
		t.Errorf("fetching what the archive lacks: %v, want not found", err)
	}

	outside := t.TempDir()
	secret := filepath.Join(outside, "000000010000000000000004")
	if err := os.WriteFile(secret, segment, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, req := range []wal.Request{
		{Op: "push", Path: secret},
		{Op: "push", Path: filepath.Join(data, "..", filepath.Base(outside), "000000010000000000000004")},
		{Op: "fetch", Name: name, Path: filepath.Join(outside, "written")},
		{Op: "delete", Path: filepath.Join(data, "pg_wal", name)},
	} {
		err := wal.Ask(ctx, socket, req)
		if err == nil {
			t.Errorf("%+v: done", req)
		} else if req.Op != "delete" && !strings.Contains(err.Error(), "not a path under the data directory") {
			t.Errorf("%+v: %v, want refused as outside the data directory", req, err)
		}
	}
	// Symbolic links a process of the server's user could make: a WAL
	// file that is a link to a secret, a link where the fetch writes its
	// temporary file, and a link where the fetched file goes.
	linked := "000000010000000000000005"
	if err := os.Symlink(secret, filepath.Join(data, "pg_wal", linked)); err != nil {
		t.Fatal(err)
	}
	if err := wal.Ask(ctx, socket, wal.Request{Op: "push", Path: filepath.Join(data, "pg_wal", linked)}); err == nil {
		t.Error("a WAL file that is a symbolic link to a file outside was pushed")
	}
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{"RECOVERYXLOG.chartpilot-fetch", "RECOVERYHISTORY"} {
		if err := os.Symlink(target, filepath.Join(data, "pg_wal", link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, dest := range []string{"RECOVERYXLOG", "RECOVERYHISTORY"} {
		if err := wal.Ask(ctx, socket, wal.Request{Op: "fetch", Name: name, Path: filepath.Join(data, "pg_wal", dest)}); err != nil {
			t.Errorf("fetch to %s: %v", dest, err)
		}
		if fi, err := os.Lstat(filepath.Join(data, "pg_wal", dest)); err != nil || !fi.Mode().IsRegular() || fi.Size() != seg {
			t.Errorf("pg_wal/%s after the fetch: %v %v, want the segment, a regular file", dest, fi, err)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "keep me" {
		t.Errorf("a fetch wrote through a symbolic link: %q", b)
	}
	if names, _ := a.List(ctx); len(names) != 1 {
		t.Errorf("the archive holds %v after the refused requests, want only %s", names, name)
	}
	if _, err := os.Stat(filepath.Join(outside, "written")); !os.IsNotExist(err) {
		t.Errorf("a file was written outside the data directory: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) != 6 {
		t.Errorf("logged %q, want the 6 failed requests", logged)
	}
}

// TestServiceStandbyKeepsWhatIsArchived: a segment the archive holds with
// other content fails the primary's push (the archive is never
// overwritten, and another server may be archiving to the prefix), while
// a standby's push of it (archive_mode always: at a timeline's end it
// marks the segment cut at the fork under the full name) is acknowledged,
// logged, and leaves the archived file as it was: the standby's archiving
// goes on instead of holding its WAL for ever.
func TestServiceStandbyKeepsWhatIsArchived(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	const seg = 1 << 20
	a := &wal.Archive{Bucket: b, Prefix: "ns/db", SegmentSize: seg, Retries: -1}
	const name = "000000010000000000000007"
	primaryCopy := bytes.Repeat([]byte("old!"), seg/4)
	if err := a.PushBytes(ctx, name, primaryCopy); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "pg_wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	cut := append(bytes.Repeat([]byte("old!"), seg/8), bytes.Repeat([]byte{0}, seg/2)...)
	if err := os.WriteFile(filepath.Join(data, "pg_wal", name), cut, 0o600); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "wal.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged []string
	svc := &wal.Service{Archive: a, DataDir: data, Parallel: 1, Log: func(op, n string, err error) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, op+" "+n+": "+err.Error())
	}}
	go func() { _ = svc.Serve(ctx, l) }()
	push := wal.Request{Op: "push", Path: filepath.Join(data, "pg_wal", name)}
	if err := wal.Ask(ctx, socket, push); err == nil || !strings.Contains(err.Error(), "archived already with other content") {
		t.Fatalf("a primary's push of other content: %v, want it refused", err)
	}
	if err := os.WriteFile(filepath.Join(data, "standby.signal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := wal.Ask(ctx, socket, push); err != nil {
		t.Fatalf("a standby's push of a segment archived with other content: %v, want it acknowledged", err)
	}
	got, err := a.Read(ctx, name)
	if err != nil || !bytes.Equal(got, primaryCopy) {
		t.Fatalf("the archived file after the standby's push: %d bytes (%v), want the primary's, unchanged", len(got), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(logged, "\n"), "kept the archived file") {
		t.Errorf("nothing logged of the standby's differing segment: %v", logged)
	}
}
