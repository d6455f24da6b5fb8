// Package wal archives PostgreSQL's write-ahead log to a backup store and
// brings it back: archive_command runs Push (chartpilot wal-push),
// restore_command runs Fetch (chartpilot wal-fetch), physical base backups
// are stored beside the WAL (BaseBackup), and Recover prepares a data
// directory that replays them to a point in time and promotes.
//
// A store holds, under an archive's prefix:
//
//	wal/<name>             one object a WAL file (segment, timeline history,
//	                       partial segment, backup history), compressed and
//	                       encrypted as backups are, its checksums in the
//	                       object's metadata
//	base/<time>/data       a base backup: pg_basebackup's tar, stored by the
//	base/<time>/manifest.json  backup data path (package backup), its start
//	                       and stop in the manifest's labels
//
// Nothing is ever overwritten: a WAL file pushed twice with the same
// content is acknowledged (PostgreSQL retries after a crash), with other
// content refused.
package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/chartpilot/chartpilot/internal/backup"
)

// Archive is the WAL archive of one server (its timelines and base
// backups) in a store.
type Archive struct {
	Bucket *blob.Bucket
	// Prefix is the archive's key prefix in the store (the namespace and
	// name of the resource, say); required.
	Prefix string
	// Compression (default zstd) and Recipient (an age X25519 public key:
	// encrypted on this side) of what is pushed.
	Compression string
	Recipient   string
	// Identity is the age X25519 secret key that fetches encrypted files.
	Identity string
	// SegmentSize is the server's wal_segment_size (0: 16 MiB).
	SegmentSize int64
	// Retries of a failed upload or download before Push or Fetch fail
	// (0: 2), Backoff the wait before the first (0: 1 s, doubled each).
	Retries int
	Backoff time.Duration
}

// ErrNotFound: the archive has no such file. Fetch's caller tells
// PostgreSQL so with a non-zero exit code, which ends recovery from the
// archive at that point (the end of WAL, or a gap, which Check names).
var ErrNotFound = errors.New("not in the archive")

func (a *Archive) segSize() int64 {
	if a.SegmentSize > 0 {
		return a.SegmentSize
	}
	return DefaultSegmentSize
}

func (a *Archive) prefix() string { return strings.Trim(a.Prefix, "/") }

// Key is the object key of WAL file name.
func (a *Archive) Key(name string) string { return a.prefix() + "/wal/" + name }

// metadata keys of a WAL object.
const (
	metaSHA256      = "sha256"       // of the bytes stored
	metaPlainSHA256 = "plain-sha256" // of the WAL file
	metaPlainSize   = "plain-size"
	metaCompression = "compression"
	metaRecipient   = "recipient"
	metaFormat      = "format"
	formatWAL       = "chartpilot.dev/wal/v1"
)

func (a *Archive) check() error {
	switch {
	case a.Bucket == nil:
		return errors.New("no store")
	case a.prefix() == "" || strings.Contains(a.Prefix, ".."):
		return fmt.Errorf("archive prefix %q: must be a non-empty key prefix without ..", a.Prefix)
	}
	if s := a.segSize(); s < 1<<20 || s > 1<<30 || s&(s-1) != 0 {
		return fmt.Errorf("segment size %d: a power of two from 1 MiB to 1 GiB (wal_segment_size)", s)
	}
	return nil
}

// maxPlain bounds a WAL file of name: a segment is the segment size; the
// other files are small text files (history, backup history) or a
// partial segment.
func (a *Archive) maxPlain(name string) int64 {
	if strings.HasSuffix(name, ".history") || strings.HasSuffix(name, ".backup") {
		return 1 << 20
	}
	return a.segSize()
}

// Push archives the WAL file at path (archive_command's %p), named by its
// base name. It returns nil only once the file is stored, or was stored
// before with the same content; a different file stored under the name is
// an error (never overwritten).
func (a *Archive) Push(ctx context.Context, path string) error {
	if err := a.check(); err != nil {
		return err
	}
	name := filepath.Base(path)
	if !ValidName(name) {
		return fmt.Errorf("%q is not a WAL file's name", name)
	}
	data, err := readBounded(path, a.maxPlain(name))
	if err != nil {
		return err
	}
	return a.PushBytes(ctx, name, data)
}

// PushBytes is Push of WAL file name read already (data).
func (a *Archive) PushBytes(ctx context.Context, name string, data []byte) error {
	if err := a.check(); err != nil {
		return err
	}
	if !ValidName(name) {
		return fmt.Errorf("%q is not a WAL file's name", name)
	}
	if int64(len(data)) > a.maxPlain(name) {
		return fmt.Errorf("%s is larger than %d bytes: not a WAL file of this server's segment size", name, a.maxPlain(name))
	}
	sum := sha256.Sum256(data)
	plainSum := hex.EncodeToString(sum[:])
	return a.retry(ctx, "pushing "+name, func() error { return a.push(ctx, name, data, plainSum) })
}

// StoredOtherError is a push of a file the archive holds already with
// other content: the archive is never overwritten.
type StoredOtherError struct{ Name, Stored, This string }

func (e *StoredOtherError) Error() string {
	return fmt.Sprintf("%s is archived already with other content (SHA-256 %s, this file's %s): an archive is never overwritten; is another server archiving to the same prefix?",
		e.Name, e.Stored, e.This)
}

// MaxFile is the largest WAL file name may be.
func (a *Archive) MaxFile(name string) int64 { return a.maxPlain(name) }

func (a *Archive) push(ctx context.Context, name string, data []byte, plainSum string) error {
	key := a.Key(name)
	attrs, err := a.Bucket.Attributes(ctx, key)
	switch {
	case err == nil:
		if attrs.Metadata[metaPlainSHA256] == plainSum {
			return nil // archived before (a retry after a crash)
		}
		return permanent(&StoredOtherError{Name: name, Stored: clip(attrs.Metadata[metaPlainSHA256]), This: plainSum})
	case gcerrors.Code(err) != gcerrors.NotFound:
		return err
	}
	compression := a.Compression
	if compression == "" {
		compression = backup.CompressionZstd
	}
	var stored bytes.Buffer
	if _, err := backup.Encode(&stored, bytes.NewReader(data), compression, a.Recipient); err != nil {
		return permanent(err)
	}
	storedSum := sha256.Sum256(stored.Bytes())
	meta := map[string]string{
		metaFormat:      formatWAL,
		metaSHA256:      hex.EncodeToString(storedSum[:]),
		metaPlainSHA256: plainSum,
		metaPlainSize:   strconv.Itoa(len(data)),
		metaCompression: compression,
	}
	if a.Recipient != "" {
		meta[metaRecipient] = strings.TrimSpace(a.Recipient)
	}
	err = a.Bucket.WriteAll(ctx, key, stored.Bytes(), &blob.WriterOptions{IfNotExist: true, Metadata: meta, ContentType: "application/octet-stream"})
	if gcerrors.Code(err) == gcerrors.FailedPrecondition {
		// Stored meanwhile (a push of the same file racing this one):
		// the next attempt compares it.
		return fmt.Errorf("%s was stored while this push ran", name)
	}
	return err
}

// PushReady pushes the WAL file at path, and meanwhile up to parallel-1
// more segments that PostgreSQL has marked ready to archive
// (pg_wal/archive_status/*.ready), oldest first; it returns path's result.
// When PostgreSQL then asks for those, Push finds them stored and answers
// at once: archiving keeps up with a server writing faster than one
// upload at a time.
func (a *Archive) PushReady(ctx context.Context, path string, parallel int) error {
	first := filepath.Base(path)
	var more []string
	if parallel > 1 {
		entries, _ := os.ReadDir(filepath.Join(filepath.Dir(path), "archive_status"))
		for _, e := range entries {
			n, ok := strings.CutSuffix(e.Name(), ".ready")
			if ok && n != first && segmentName.MatchString(n) && n > first {
				more = append(more, n)
			}
		}
		slices.Sort(more)
		if len(more) > parallel-1 {
			more = more[:parallel-1]
		}
	}
	var wg sync.WaitGroup
	for _, n := range more {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = a.Push(ctx, filepath.Join(filepath.Dir(path), n)) // retried when PostgreSQL asks for it
		}()
	}
	err := a.Push(ctx, path)
	wg.Wait()
	return err
}

// Fetch restores WAL file name (restore_command's %f) to dest (%p): it
// downloads the object, checks its size and SHA-256 against what was
// stored with it, decrypts and decompresses it within the bound of a WAL
// file, and only then moves it to dest. ErrNotFound when the archive has
// no such file.
func (a *Archive) Fetch(ctx context.Context, name, dest string) error {
	if err := a.check(); err != nil {
		return err
	}
	if !ValidName(name) {
		return fmt.Errorf("%q is not a WAL file's name", name)
	}
	return a.retry(ctx, "fetching "+name, func() error { return a.fetch(ctx, name, dest) })
}

func (a *Archive) fetch(ctx context.Context, name, dest string) error {
	data, err := a.read(ctx, name)
	if err != nil {
		return err
	}
	tmp := dest + ".chartpilot-fetch"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err == nil {
		err = writeSynced(f, data)
	}
	if err == nil {
		err = os.Rename(tmp, dest)
	}
	if err != nil {
		os.Remove(tmp)
		return permanent(err)
	}
	return nil
}

// writeSynced writes data to f, syncs and closes it.
func writeSynced(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Read is WAL file name's content, checked as Fetch checks it.
func (a *Archive) Read(ctx context.Context, name string) ([]byte, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if !ValidName(name) {
		return nil, fmt.Errorf("%q is not a WAL file's name", name)
	}
	var out []byte
	err := a.retry(ctx, "reading "+name, func() error {
		var err error
		out, err = a.read(ctx, name)
		return err
	})
	return out, err
}

func (a *Archive) read(ctx context.Context, name string) ([]byte, error) {
	key := a.Key(name)
	attrs, err := a.Bucket.Attributes(ctx, key)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, permanent(fmt.Errorf("%s: %w", name, ErrNotFound))
	}
	if err != nil {
		return nil, err
	}
	md := attrs.Metadata
	m := &backup.Manifest{Format: backup.Format, Size: attrs.Size, SHA256: md[metaSHA256], Compression: md[metaCompression], Recipient: md[metaRecipient]}
	if m.Recipient != "" {
		m.Encryption = "age"
	}
	if md[metaFormat] != formatWAL {
		return nil, permanent(fmt.Errorf("%s: the object in the store is not a WAL file chartpilot archived (no %s metadata)", name, formatWAL))
	}
	if err := m.Validate(); err != nil {
		return nil, permanent(fmt.Errorf("%s: its metadata: %w", name, err))
	}
	if a.Identity != "" && m.Recipient == "" {
		// Whoever can write the store could feed recovery WAL of its own.
		return nil, permanent(fmt.Errorf("%s is not encrypted, and the archive's files are: refused (a key is configured)", name))
	}
	plainSize, err := strconv.ParseInt(md[metaPlainSize], 10, 64)
	if err != nil || plainSize < 0 || plainSize > a.maxPlain(name) {
		return nil, permanent(fmt.Errorf("%s: its metadata's size %q is not one of a WAL file", name, clip(md[metaPlainSize])))
	}
	// A compressed and encrypted WAL file is hardly larger than the file.
	if attrs.Size > plainSize+plainSize/8+4096 {
		return nil, permanent(fmt.Errorf("%s: %d bytes stored for a %d-byte WAL file: not one chartpilot archived", name, attrs.Size, plainSize))
	}
	// No more than the size checked above is read: the object may have
	// been replaced since.
	br, err := a.Bucket.NewReader(ctx, key, nil)
	if err != nil {
		return nil, err
	}
	stored, err := io.ReadAll(io.LimitReader(br, attrs.Size+1))
	br.Close()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(stored)
	if got := hex.EncodeToString(sum[:]); int64(len(stored)) != m.Size || got != m.SHA256 {
		return nil, permanent(fmt.Errorf("%s is corrupted in the store: %d bytes with SHA-256 %s, stored as %d bytes with %s", name, len(stored), got, m.Size, m.SHA256))
	}
	r, closeFn, err := backup.Decode(bytes.NewReader(stored), m, a.Identity)
	if err != nil {
		return nil, permanent(fmt.Errorf("%s: %w", name, err))
	}
	if closeFn != nil {
		defer closeFn()
	}
	plain, err := io.ReadAll(io.LimitReader(r, plainSize+1))
	if err != nil {
		return nil, permanent(fmt.Errorf("%s: decoding: %w", name, err))
	}
	psum := sha256.Sum256(plain)
	if int64(len(plain)) != plainSize || hex.EncodeToString(psum[:]) != md[metaPlainSHA256] {
		return nil, permanent(fmt.Errorf("%s decodes to other content than was archived", name))
	}
	return plain, nil
}

// List is the names of the WAL files archived, in order.
func (a *Archive) List(ctx context.Context) ([]string, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	var out []string
	it := a.Bucket.List(&blob.ListOptions{Prefix: a.prefix() + "/wal/"})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if n := strings.TrimPrefix(obj.Key, a.prefix()+"/wal/"); ValidName(n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// retry runs op until it succeeds, fails permanently, or Retries more
// attempts failed.
func (a *Archive) retry(ctx context.Context, what string, op func() error) error {
	retries, wait := a.Retries, a.Backoff
	if retries == 0 {
		retries = 2
	}
	if wait == 0 {
		wait = time.Second
	}
	for attempt := 0; ; attempt++ {
		err := op()
		var p permanentError
		if err == nil || errors.As(err, &p) || attempt >= retries || ctx.Err() != nil {
			if errors.As(err, &p) {
				return p.err
			}
			if err != nil && attempt > 0 {
				return fmt.Errorf("%s (%d attempts): %w", what, attempt+1, err)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// permanentError is not retried.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

func permanent(err error) error { return permanentError{err} }

// readBounded reads a file of at most max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a WAL file of this server's segment size", path, max)
	}
	return data, nil
}

// clip shortens what a store said for a message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
