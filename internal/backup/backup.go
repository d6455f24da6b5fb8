package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"strings"
	"time"

	"filippo.io/age"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// Format names the layout of a backup: <location>/data and
// <location>/manifest.json.
const Format = "chartpilot.dev/backup/v1"

// Compression of the data.
const (
	CompressionZstd = "zstd"
	CompressionNone = "none"
)

// Manifest describes a backup; it is stored beside the data, written last
// (a location without one holds no complete backup).
type Manifest struct {
	Format  string    `json:"format"`
	Created time.Time `json:"created"`
	// Size and SHA256 are of the bytes stored (compressed, encrypted): a
	// restore checks them before it reads anything else.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// PlainSize is the size of the stream backed up.
	PlainSize   int64  `json:"plainSize"`
	Compression string `json:"compression"`
	// Encryption is "age" (X25519, recipient named) or "" (none).
	Encryption string `json:"encryption,omitempty"`
	Recipient  string `json:"recipient,omitempty"`
	// Labels are free facts: database version, chart version, source.
	Labels map[string]string `json:"labels,omitempty"`
}

// Options of a backup.
type Options struct {
	// Compression: CompressionZstd (default) or CompressionNone.
	Compression string
	// Recipient, when set, encrypts the data on this side for it (an age
	// X25519 public key, "age1…"); the store never sees plaintext.
	Recipient string
	Labels    map[string]string
	// LateLabels, when set, is called once the stream has ended; what it
	// returns is added to the labels (facts known only at the end, such as
	// where a base backup stopped).
	LateLabels func() map[string]string
	// Now is the clock (tests).
	Now func() time.Time
}

func dataKey(location string) string     { return strings.TrimSuffix(location, "/") + "/data" }
func manifestKey(location string) string { return strings.TrimSuffix(location, "/") + "/manifest.json" }

// ErrExists: a backup is already stored at the location; it is never
// overwritten.
var ErrExists = errors.New("a backup already exists at this location; backups are never overwritten")

// Write backs src up to location in b and returns its manifest. Nothing
// at the location is overwritten: a location that holds data or a manifest
// already is refused (ErrExists). On an error the partial data is deleted.
func Write(ctx context.Context, b *blob.Bucket, location string, src io.Reader, o Options) (*Manifest, error) {
	if location == "" || strings.Contains(location, "..") {
		return nil, fmt.Errorf("location %q: must be a non-empty key prefix without ..", location)
	}
	m := &Manifest{Format: Format, Compression: o.Compression, Labels: o.Labels}
	if m.Compression == "" {
		m.Compression = CompressionZstd
	}
	if m.Compression != CompressionZstd && m.Compression != CompressionNone {
		return nil, fmt.Errorf("compression %q: must be %s or %s", m.Compression, CompressionZstd, CompressionNone)
	}
	var recipient age.Recipient
	if o.Recipient != "" {
		r, err := age.ParseX25519Recipient(strings.TrimSpace(o.Recipient))
		if err != nil {
			return nil, fmt.Errorf("encryption recipient: not an age X25519 public key (age1…): %w", err)
		}
		recipient, m.Encryption, m.Recipient = r, "age", r.String()
	}
	for _, k := range []string{dataKey(location), manifestKey(location)} {
		exists, err := b.Exists(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("checking %s: %w", k, err)
		}
		if exists {
			return nil, fmt.Errorf("%s: %w", location, ErrExists)
		}
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	m.Created = now().UTC().Truncate(time.Second)

	// The encoded stream is uploaded with one Upload call reading a pipe
	// (drivers stream it: multipart for S3, blocks for Azure). An encoding
	// error cancels the upload's context before the pipe reports it, so
	// that the driver aborts instead of committing what it has.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	stored := &counter{h: sha256.New()}
	plain := &counter{}
	encoded := make(chan error, 1)
	go func() {
		err := encode(io.MultiWriter(pw, stored), src, plain, m.Compression, recipient)
		if err != nil {
			cancel() // a cancelled upload stores nothing
		}
		_ = pw.CloseWithError(err) // nil: end of stream
		encoded <- err
	}()
	upErr := b.Upload(wctx, dataKey(location), pr, &blob.WriterOptions{IfNotExist: true, ContentType: "application/octet-stream"})
	if upErr != nil {
		cancel()
		_ = pr.CloseWithError(upErr) // unblocks the encoder
	}
	if err := <-encoded; err != nil {
		return nil, fmt.Errorf("backing up to %s: %w", location, err)
	}
	if upErr != nil {
		if gcerrors.Code(upErr) == gcerrors.FailedPrecondition {
			return nil, fmt.Errorf("%s: %w", location, ErrExists)
		}
		return nil, fmt.Errorf("uploading %s: %w", dataKey(location), upErr)
	}
	m.Size, m.SHA256, m.PlainSize = stored.n, hex.EncodeToString(stored.h.Sum(nil)), plain.n
	if o.LateLabels != nil {
		late := o.LateLabels()
		if len(late) > 0 && m.Labels == nil {
			m.Labels = map[string]string{}
		} else if len(late) > 0 {
			m.Labels = maps.Clone(m.Labels)
		}
		maps.Copy(m.Labels, late)
	}
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := b.Upload(ctx, manifestKey(location), bytes.NewReader(body), &blob.WriterOptions{IfNotExist: true, ContentType: "application/json"}); err != nil {
		return nil, fmt.Errorf("writing the manifest of %s (the data is stored, but without a manifest the backup is not complete): %w", location, err)
	}
	return m, nil
}

func isNotFound(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }

// ReadManifest reads the manifest of the backup at location.
//
// Anyone who can write to the store can write the manifest: it is read
// within MaxManifestSize and every field is checked (Validate) before it is
// used or shown.
func ReadManifest(ctx context.Context, b *blob.Bucket, location string) (*Manifest, error) {
	r, err := b.NewReader(ctx, manifestKey(location), nil)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("no backup at %s (no manifest.json): %w", location, err)
		}
		return nil, err
	}
	defer r.Close()
	body, err := io.ReadAll(io.LimitReader(r, MaxManifestSize+1))
	if err != nil {
		return nil, err
	}
	if len(body) > MaxManifestSize {
		return nil, fmt.Errorf("the manifest of %s is larger than %d bytes: it is not one chartpilot wrote", location, MaxManifestSize)
	}
	m := &Manifest{}
	if err := json.Unmarshal(body, m); err != nil || m.Format != Format {
		return nil, fmt.Errorf("the manifest of %s is not a %s manifest", location, Format)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("the manifest of %s: %w", location, err)
	}
	return m, nil
}

// MaxManifestSize bounds a manifest read from a store (one chartpilot
// writes is well under 2 KiB).
const MaxManifestSize = 64 << 10

// Validate checks each field of a manifest read from a store or a pod's
// message, so that what a hostile writer put there cannot reach a status,
// a log line or a restore unchecked.
func (m *Manifest) Validate() error {
	switch {
	case m.Format != Format:
		return fmt.Errorf("format: not %s", Format)
	case len(m.SHA256) != 64 || strings.Trim(m.SHA256, "0123456789abcdef") != "":
		return errors.New("sha256: not 64 lower-case hexadecimal digits")
	case m.Size < 0 || m.PlainSize < 0:
		return errors.New("size: negative")
	case m.Compression != CompressionZstd && m.Compression != CompressionNone:
		return fmt.Errorf("compression: not %s or %s", CompressionZstd, CompressionNone)
	case m.Encryption != "" && m.Encryption != "age":
		return errors.New("encryption: not age or empty")
	case len(m.Recipient) > 128 || (m.Recipient != "" && !strings.HasPrefix(m.Recipient, "age1")):
		return errors.New("recipient: not an age recipient (age1…)")
	case len(m.Labels) > 32:
		return errors.New("labels: more than 32")
	}
	for k, v := range m.Labels {
		if len(k) > 63 || len(v) > 256 {
			return errors.New("labels: a label longer than 63 (name) or 256 (value) bytes")
		}
	}
	return nil
}

// Open returns the backed-up stream of the backup at location, after it
// has checked the stored data against the manifest's size and SHA-256 (the
// data is downloaded to a file in tmpDir first, so nothing of a corrupted
// backup reaches the caller). identity is the age X25519 secret key
// ("AGE-SECRET-KEY-1…") of an encrypted backup. Close the reader to remove
// the file.
//
// want, when set, is what the operator recorded of the backup when it was
// made (its Backup's status): anyone who can write to the store can write
// a manifest and data that agree with each other, so a backup that is not
// the recorded one is refused before anything is downloaded, and no more
// than its recorded size is ever downloaded.
func Open(ctx context.Context, b *blob.Bucket, location, identity, tmpDir string, want Expect) (io.ReadCloser, *Manifest, error) {
	m, err := ReadManifest(ctx, b, location)
	if err != nil {
		return nil, nil, err
	}
	if (want.SHA256 != "" && m.SHA256 != want.SHA256) || (want.Size > 0 && m.Size != want.Size) {
		return nil, m, fmt.Errorf("the backup at %s is not the one recorded (its manifest says %d bytes with SHA-256 %s, the Backup recorded %d bytes with %s): it was replaced in the store; nothing was restored",
			location, m.Size, m.SHA256, want.Size, want.SHA256)
	}
	r, err := b.NewReader(ctx, dataKey(location), nil)
	if err != nil {
		return nil, m, fmt.Errorf("reading %s: %w", dataKey(location), err)
	}
	f, err := os.CreateTemp(tmpDir, "chartpilot-restore-*")
	if err != nil {
		r.Close()
		return nil, m, err
	}
	cleanup := func() { f.Close(); os.Remove(f.Name()) }
	got := &counter{h: sha256.New()}
	// One byte more than the manifest says tells a larger object apart
	// without storing it.
	_, err = io.Copy(io.MultiWriter(f, got), io.LimitReader(r, m.Size+1))
	r.Close()
	if err != nil {
		cleanup()
		return nil, m, fmt.Errorf("downloading %s: %w", dataKey(location), err)
	}
	if sum := hex.EncodeToString(got.h.Sum(nil)); got.n != m.Size || sum != m.SHA256 {
		cleanup()
		return nil, m, fmt.Errorf("the data of %s is corrupted: %d bytes with SHA-256 %s, the manifest says %d bytes with %s; nothing was restored", location, got.n, sum, m.Size, m.SHA256)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		cleanup()
		return nil, m, err
	}
	in, closeFn, err := Decode(f, m, identity)
	if err != nil {
		cleanup()
		return nil, m, fmt.Errorf("%s: %w", location, err)
	}
	return &restoreReader{Reader: in, close: func() {
		if closeFn != nil {
			closeFn()
		}
		cleanup()
	}}, m, nil
}

// Expect is what the operator recorded of a backup when it was made.
type Expect struct {
	// SHA256 and Size are of the bytes stored; empty and 0: not known
	// (a restore from a location in a store, not from a Backup).
	SHA256 string
	Size   int64
}

type restoreReader struct {
	io.Reader
	close func()
}

func (r *restoreReader) Close() error { r.close(); return nil }

// counter counts bytes and, with h, hashes them.
type counter struct {
	n int64
	h hash.Hash
}

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	if c.h != nil {
		c.h.Write(p)
	}
	return len(p), nil
}
