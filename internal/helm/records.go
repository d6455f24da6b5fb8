package helm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// DefaultMaxRecordSize bounds a release record's decompressed size.
const DefaultMaxRecordSize = 16 << 20

// Records says how release records (Helm's storage Secrets, which anyone
// who may write Secrets in the namespace can change) are written and read.
type Records struct {
	// Key signs every record written (HMAC-SHA256 over namespace, name,
	// revision, status, chartpilot's labels and the digest of the manifest
	// and hooks) and is checked on every read: Helm actions refuse a record
	// without a valid MAC. Nil: records are neither signed nor checked.
	Key []byte
	// MaxSize bounds a record's decompressed size (0: DefaultMaxRecordSize);
	// a larger record is refused, not decoded.
	MaxSize int64
}

func (o Records) maxSize() int64 {
	if o.MaxSize > 0 {
		return o.MaxSize
	}
	return DefaultMaxRecordSize
}

// RecordError is a release record that cannot be acted on.
type RecordError struct {
	// Record is the Secret's name.
	Record string
	// TooLarge: the record decompresses beyond the limit; Invalid: it does
	// not decode (err says why); Missing: Record is a chunk of record of
	// that is not there; else its MAC is missing or wrong (not written by
	// chartpilot, or changed since).
	TooLarge, Invalid, Missing bool
	// of is the record whose chunk Record is ("" for a record itself).
	of    string
	limit int64
	err   error
}

func (e *RecordError) Unwrap() error { return e.err }

// ofChunk reports whether the error is of a chunk of the record: missing,
// or without a valid MAC.
func (e *RecordError) ofChunk() bool { return e.Missing || e.of != "" }

func (e *RecordError) Error() string {
	if e.TooLarge {
		return fmt.Sprintf("release record %s decompresses to more than %d bytes: it was not decoded", e.Record, e.limit)
	}
	if e.Invalid {
		return fmt.Sprintf("release record %s cannot be read: %v", e.Record, e.err)
	}
	if e.Missing {
		return fmt.Sprintf("release record %s is stored in chunks and its chunk %s is missing", e.of, e.Record)
	}
	if e.of != "" {
		return fmt.Sprintf("chunk %s of release record %s was not written by chartpilot or was changed since (no valid MAC)", e.Record, e.of)
	}
	return fmt.Sprintf("release record %s was not written by chartpilot or was changed since (no valid MAC)", e.Record)
}

// MaxStoredRecord is the most a release record may hold in one Secret,
// encoded: the data of a Secret is limited to 1 MiB by the API server. A
// larger record is stored in chunks (chunks.go).
const MaxStoredRecord = 1 << 20

// RecordTooLargeError is a release whose record would be larger than the
// size limit on reading records: nothing is stored, nothing applied.
type RecordTooLargeError struct {
	Release string
	// Size is the record's decompressed size, Limit the limit.
	Size  int
	Limit int64
}

func (e *RecordTooLargeError) Error() string {
	return fmt.Sprintf("the record of release %s would hold %d KiB (chart, values and rendered manifest, decompressed) and records are limited to %d KiB (--max-release-record-size): "+
		"nothing was stored or applied; make the resource's spec (or the chart) smaller", e.Release, (e.Size+1023)/1024, (e.Limit+1023)/1024)
}

// recordDriver stores releases in Secrets as Helm's own Secrets driver
// does (the same format: the helm CLI reads them), adding a MAC label and
// a size limit on decoding.
type recordDriver struct {
	secrets   typedcorev1.SecretInterface
	namespace string
	opts      Records
	// index and store, when set, serve reads from the cache (recordcache.go).
	index RecordIndex
	store *recordStore
	// first is set for an install attempt that skips existence checks.
	first *firstInstall
	// purge is set for an uninstall that deletes every record at its end
	// (Client.Purge): only the newest record is read, the "uninstalling"
	// mark is not stored, and records are deleted unread.
	purge bool
	// chunkedSeen: a record listed by this driver is chunked (a purge
	// then looks for chunks to delete; see sweepChunks).
	chunkedSeen bool
}

// listNewest is list, and with onlyNewest the name of the newest record,
// the only one whose body is read (the others carry their labels only).
func (d *recordDriver) listNewest(set labels.Set, onlyNewest bool) ([]*corev1.Secret, string, error) {
	if !onlyNewest {
		items, err := d.list(set)
		return items, "", err
	}
	if d.index != nil {
		return d.newestBody(set)
	}
	items, err := d.list(set)
	return items, newestRecord(items), err
}

// newestRecord names the record of the highest revision ("" for none).
func newestRecord(items []*corev1.Secret) string {
	name, best := "", -1
	for _, s := range items {
		if v, err := strconv.Atoi(s.Labels[StorageLabelVersion]); err == nil && v > best {
			name, best = s.Name, v
		}
	}
	return name
}

// unread is a record known by its labels only: name, revision, status.
func (d *recordDriver) unread(s *corev1.Secret) *release.Release {
	v, _ := strconv.Atoi(s.Labels[StorageLabelVersion])
	return &release.Release{Name: s.Labels[StorageLabelName], Namespace: d.namespace, Version: v,
		Info: &release.Info{Status: release.Status(s.Labels[StorageLabelStatus])}, Labels: s.Labels}
}

// list returns the records of the namespace matching set: from the cache
// when there is one, else from the API server.
func (d *recordDriver) list(set labels.Set) ([]*corev1.Secret, error) {
	if d.index != nil {
		return d.cachedRecords(set)
	}
	list, err := d.secrets.List(context.Background(), metav1.ListOptions{LabelSelector: set.AsSelector().String()})
	if err != nil {
		return nil, fmt.Errorf("listing release records: %w", err)
	}
	out := make([]*corev1.Secret, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// get reads one record: through the cache when there is one and the key
// has Helm's form (sh.helm.release.v1.<name>.v<revision>), else from the
// API server.
func (d *recordDriver) get(key string) (*corev1.Secret, error) {
	if d.index != nil {
		if name, rev, ok := parseRecordKey(key); ok {
			items, err := d.cachedRecords(labels.Set{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: name, StorageLabelVersion: rev})
			if err != nil {
				return nil, err
			}
			for _, s := range items {
				if s.Name == key {
					return s, nil
				}
			}
			return nil, apierrors.NewNotFound(corev1.Resource("secrets"), key)
		}
	}
	return d.secrets.Get(context.Background(), key, metav1.GetOptions{})
}

// parseRecordKey reads a record name of Helm's form.
func parseRecordKey(key string) (name, rev string, ok bool) {
	rest, ok := strings.CutPrefix(key, "sh.helm.release.v1.")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, ".v")
	if i <= 0 {
		return "", "", false
	}
	if _, err := strconv.Atoi(rest[i+2:]); err != nil {
		return "", "", false
	}
	return rest[:i], rest[i+2:], true
}

// wrote remembers a record this process wrote.
func (d *recordDriver) wrote(s *corev1.Secret) {
	if d.store != nil && s != nil {
		d.store.remember(d.namespace, s, true)
	}
}

var _ driver.Driver = (*recordDriver)(nil)

func (d *recordDriver) Name() string { return driver.SecretsDriverName }

// Get reads one record; a record that fails the checks is an error.
func (d *recordDriver) Get(key string) (*release.Release, error) {
	s, err := d.read(key)
	if err != nil {
		return nil, err
	}
	return d.checked(s)
}

// read reads one record's Secret; an absent one is ErrReleaseNotFound.
func (d *recordDriver) read(key string) (*corev1.Secret, error) {
	s, err := d.get(key)
	if apierrors.IsNotFound(err) {
		return nil, driver.ErrReleaseNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading release record %s: %w", key, err)
	}
	return s, nil
}

// checked decodes a record that must pass the checks (size, MAC).
func (d *recordDriver) checked(s *corev1.Secret) (*release.Release, error) {
	rel, trusted, err := d.decode(s)
	if err != nil {
		return nil, err
	}
	if !trusted {
		return nil, &RecordError{Record: s.Name}
	}
	rel.Labels = userLabels(s.Labels)
	return rel, nil
}

// List reads every release record of the namespace that filter keeps.
func (d *recordDriver) List(filter func(*release.Release) bool) ([]*release.Release, error) {
	rels, err := d.query(labels.Set{StorageLabelOwner: StorageOwnerHelm})
	if err != nil {
		return nil, err
	}
	var out []*release.Release
	for _, r := range rels {
		if filter(r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// Query reads the release records with these labels.
func (d *recordDriver) Query(set map[string]string) ([]*release.Release, error) {
	rels, err := d.query(labels.Set(set))
	if err != nil {
		return nil, err
	}
	if len(rels) == 0 {
		return nil, driver.ErrReleaseNotFound
	}
	return rels, nil
}

func (d *recordDriver) query(set labels.Set) ([]*release.Release, error) {
	// A purge reads the history of its one release: only the newest
	// record of it whole.
	items, newest, err := d.listNewest(set, d.purge && set[StorageLabelName] != "")
	if err != nil {
		return nil, err
	}
	out := make([]*release.Release, 0, len(items))
	for _, s := range items {
		d.chunkedSeen = d.chunkedSeen || s.Labels[v1alpha1.LabelRecordChunks] != ""
		if newest != "" && s.Name != newest {
			out = append(out, d.unread(s))
			continue
		}
		rel, trusted, err := d.decode(s)
		if err != nil {
			return nil, err
		}
		if !trusted {
			return nil, &RecordError{Record: s.Name}
		}
		rel.Labels = s.Labels
		out = append(out, rel)
	}
	return out, nil
}

// Create stores a new record (a chunked one: its chunks first).
func (d *recordDriver) Create(key string, rel *release.Release) error {
	e, err := d.encode(key, rel, "createdAt")
	if err != nil {
		return err
	}
	if err := d.writeChunks(e); err != nil {
		return err
	}
	made, err := d.secrets.Create(context.Background(), e.head, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return driver.ErrReleaseExists
		}
		return fmt.Errorf("creating release record %s: %w", key, err)
	}
	d.wrote(made)
	d.sweepChunks(rel.Name, e.chunked())
	return nil
}

// Update replaces a record.
func (d *recordDriver) Update(key string, rel *release.Release) error {
	if d.purge && rel.Info != nil && rel.Info.Status == release.StatusUninstalling {
		return nil // see purge
	}
	if d.first != nil && d.first.hadConflict() && rel.Info != nil && rel.Info.Status == release.StatusFailed {
		// The attempt is undone, not failed (see firstInstall): its record
		// stays pending until deleted, so that nothing ever uninstalls it.
		return fmt.Errorf("release record %s not marked failed: the install is undone", key)
	}
	e, err := d.encode(key, rel, "modifiedAt")
	if err != nil {
		return err
	}
	if err := d.writeChunks(e); err != nil {
		return err
	}
	updated, err := d.secrets.Update(context.Background(), e.head, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("updating release record %s: %w", key, err)
	}
	d.wrote(updated)
	// The chunks of the body it held before, if another, are no one's now.
	d.sweepChunks(rel.Name, e.chunked())
	return nil
}

// Delete removes a record, after reading it as Helm expects (a purge
// deletes it unread and returns no release: Helm's purge does not use it).
func (d *recordDriver) Delete(key string) (*release.Release, error) {
	var rel *release.Release
	chunked := d.chunkedSeen
	if !d.purge {
		s, err := d.read(key)
		if err != nil {
			return nil, err
		}
		if rel, err = d.checked(s); err != nil {
			return nil, err
		}
		chunked = s.Labels[v1alpha1.LabelRecordChunks] != ""
	}
	// Already gone (another writer, or a read of a cache that had not seen
	// it go) is what the delete wanted: deletes are idempotent.
	if err := d.secrets.Delete(context.Background(), key, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("deleting release record %s: %w", key, err)
	}
	if d.store != nil {
		d.store.forget(d.namespace, key)
	}
	if name, _, ok := parseRecordKey(key); ok {
		d.sweepChunks(name, chunked)
	}
	return rel, nil
}

// IsRecordConflict reports whether an action failed because the record of
// the revision it was to write already exists: another writer got there
// first, or the cache of records lagged behind. Trying again reads the
// history anew.
func IsRecordConflict(err error) bool { return errors.Is(err, driver.ErrReleaseExists) }
