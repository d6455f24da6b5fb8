package helm

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/lru"
)

// RecordIndex lists the metadata of the release records of a namespace
// whose labels match, from an informer cache (never the API server).
type RecordIndex func(ctx context.Context, namespace string, match map[string]string) ([]metav1.ObjectMeta, error)

// UseRecordIndex makes release history come from idx: the records that
// exist and their resource versions from the cache, their bodies from
// memory (what this process wrote or read before) or, for a version not
// seen yet, one GET of that record. Writes still go to the API server.
// Without it every history read lists the records from the API server.
func (c *Client) UseRecordIndex(idx RecordIndex) {
	c.recordIndex = idx
	c.recordStore = &recordStore{m: map[string]map[string]*storedRecord{}, revisions: lru.New(128)}
}

// recentWrite is how long a record this process wrote (or deleted) counts
// although the cache does not show it yet.
const recentWrite = 30 * time.Second

// recordStore remembers the records this process wrote or read: their
// resource version, labels and encoded body, so that a record the cache
// shows at the same version is never read again, and a write the cache
// has not caught up with is seen by the next read (read your writes).
type recordStore struct {
	mu sync.Mutex
	// m holds the records by namespace and release (bucketOf), then
	// name: a history read looks at its own release's records only (with
	// every record in one map, going through them was a tenth of the
	// operator's CPU in an upgrade wave of 500 releases).
	m map[string]map[string]*storedRecord
	// revisions holds the latest revisions read by Client.Revision
	// (decoded and checked), by namespace/name@resourceVersion: the pass
	// that finds a release settled reads its newest revision, and decoding
	// it every time (base64, gzip, JSON of chart and manifest) was a tenth
	// of all the operator allocated in an upgrade wave.
	revisions *lru.Cache
	// bodies are the bodies of chunked records (chunks.go).
	bodies bodies
}

// maxRememberedManifest bounds the manifest of a revision kept in
// recordStore.revisions.
const maxRememberedManifest = 256 << 10

type storedRecord struct {
	rv      string
	labels  map[string]string
	data    []byte
	info    []byte // a chunked record's Info (chunks.go)
	deleted bool
	written bool // this process wrote this version (not only read it)
	at      time.Time
}

func (s *recordStore) remember(namespace string, sec *corev1.Secret, written bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(namespace, sec.Name, &storedRecord{rv: sec.ResourceVersion, labels: sec.Labels, data: sec.Data["release"], info: sec.Data[headInfoKey], written: written, at: time.Now()})
}

// bucketOf is the key of recordStore.m for record name of namespace: the
// namespace and the release the name is of ("" when it is not of Helm's
// form).
func bucketOf(namespace, name string) string {
	release, _, _ := parseRecordKey(name)
	return namespace + "/" + release
}

// getLocked returns record name of namespace, nil when none (s.mu held).
func (s *recordStore) getLocked(namespace, name string) *storedRecord {
	return s.m[bucketOf(namespace, name)][name]
}

// putLocked stores e as record name of namespace (s.mu held).
func (s *recordStore) putLocked(namespace, name string, e *storedRecord) {
	key := bucketOf(namespace, name)
	b := s.m[key]
	if b == nil {
		b = map[string]*storedRecord{}
		s.m[key] = b
	}
	b[name] = e
}

// dropLocked removes record name of namespace (s.mu held).
func (s *recordStore) dropLocked(namespace, name string) {
	key := bucketOf(namespace, name)
	b := s.m[key]
	delete(b, name)
	if len(b) == 0 {
		delete(s.m, key)
	}
}

// bucketsLocked returns the buckets that may hold records matching set in
// namespace: its release's and the one of names not of Helm's form when
// set names a release, else every bucket of the namespace (s.mu held).
func (s *recordStore) bucketsLocked(namespace string, set labels.Set) []map[string]*storedRecord {
	if release, ok := set[StorageLabelName]; ok {
		return []map[string]*storedRecord{s.m[namespace+"/"+release], s.m[namespace+"/"]}
	}
	var out []map[string]*storedRecord
	prefix := namespace + "/"
	for key, b := range s.m {
		if strings.HasPrefix(key, prefix) {
			out = append(out, b)
		}
	}
	return out
}

// WroteRecord reports whether this process wrote record name of namespace
// at resource version rv or later: a change of a record seen at such a
// version is an echo of its own write, anything else was made elsewhere.
func (c *Client) WroteRecord(namespace, name, rv string) bool {
	root := c
	if c.parent != nil {
		root = c.parent
	}
	st := root.recordStore
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.getLocked(namespace, name)
	return e != nil && e.written && !e.deleted && (e.rv == rv || olderThan(rv, e.rv))
}

func (s *recordStore) forget(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv := ""
	if e := s.getLocked(namespace, name); e != nil {
		rv = e.rv
	}
	s.putLocked(namespace, name, &storedRecord{rv: rv, deleted: true, at: time.Now()})
}

// olderThan reports whether resource version a is older than b (versions
// are etcd revisions; one that is not a number is never older).
func olderThan(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}

// cachedRecords are the records of namespace matching set: the cache's
// view merged with this process's recent writes, each with its body (from
// memory, or one GET when the cache shows a version not seen here).
func (d *recordDriver) cachedRecords(set labels.Set) ([]*corev1.Secret, error) {
	ctx := context.Background()
	wants, err := d.current(ctx, set)
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Secret, 0, len(wants))
	for _, w := range wants {
		sec, err := d.body(ctx, w.name, w.rv)
		if apierrors.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, nil
}

// newestBody is cachedRecords with only the newest record's body read
// (its name is returned): the others carry their labels only.
func (d *recordDriver) newestBody(set labels.Set) ([]*corev1.Secret, string, error) {
	ctx := context.Background()
	wants, err := d.current(ctx, set)
	if err != nil {
		return nil, "", err
	}
	newest, best := -1, -1
	for i, w := range wants {
		if v, err := strconv.Atoi(w.labels[StorageLabelVersion]); err == nil && v > best {
			newest, best = i, v
		}
	}
	out := make([]*corev1.Secret, 0, len(wants))
	name := ""
	for i, w := range wants {
		if i != newest {
			out = append(out, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: d.namespace, ResourceVersion: w.rv, Labels: w.labels}})
			continue
		}
		// The newest gone meanwhile is an error, not a shorter history:
		// its objects are what is deleted.
		sec, err := d.body(ctx, w.name, w.rv)
		if err != nil {
			return nil, "", err
		}
		out, name = append(out, sec), sec.Name
	}
	return out, name, nil
}

// recordMeta is one record as the cache and this process's writes see it.
type recordMeta struct {
	name, rv string
	labels   map[string]string
}

// current lists the records matching set: the cache's view merged with
// this process's recent writes and deletes.
func (d *recordDriver) current(ctx context.Context, set labels.Set) ([]recordMeta, error) {
	metas, err := d.index(ctx, d.namespace, set)
	if err != nil {
		return nil, fmt.Errorf("listing release records from the cache: %w", err)
	}
	st := d.store
	type want = recordMeta
	var wants []want
	seen := map[string]bool{}
	st.mu.Lock()
	now := time.Now()
	for _, m := range metas {
		seen[m.Name] = true
		e := st.getLocked(d.namespace, m.Name)
		switch {
		case e != nil && e.deleted && !olderThan(e.rv, m.ResourceVersion) && now.Sub(e.at) < recentWrite:
			continue // deleted here; the cache has not seen it go yet
		case e != nil && !e.deleted && olderThan(m.ResourceVersion, e.rv):
			if hasLabels(e.labels, set) {
				wants = append(wants, want{m.Name, e.rv, e.labels}) // written here after what the cache shows
			}
		default:
			wants = append(wants, want{m.Name, m.ResourceVersion, m.Labels})
		}
	}
	for _, b := range st.bucketsLocked(d.namespace, set) {
		for name, e := range b {
			if seen[name] {
				continue
			}
			if now.Sub(e.at) >= recentWrite {
				if e.deleted || hasLabels(e.labels, set) {
					st.dropLocked(d.namespace, name) // gone from the cache: deleted, or never seen again
				}
				continue
			}
			if !e.deleted && hasLabels(e.labels, set) {
				wants = append(wants, want{name, e.rv, e.labels}) // created here; the cache has not caught up
			}
		}
	}
	st.mu.Unlock()
	return wants, nil
}

// hasLabels reports whether l holds every label of set (a selector of
// set, without building one for each record).
func hasLabels(l map[string]string, set labels.Set) bool {
	for k, v := range set {
		if got, ok := l[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// RecordLabels returns the labels of a release's records from the cache,
// merged with this process's own recent writes, without reading a body;
// false without a cache (UseRecordIndex).
func (c *Client) RecordLabels(namespace, name string) ([]map[string]string, bool) {
	d, err := c.records(namespace)
	if err != nil || d.index == nil {
		return nil, false
	}
	metas, err := d.current(context.Background(), labels.Set{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: name})
	if err != nil {
		return nil, false
	}
	out := make([]map[string]string, len(metas))
	for i, m := range metas {
		out[i] = m.labels
	}
	return out, true
}

// body returns record name at resource version rv (or newer) from memory,
// else reads it once.
func (d *recordDriver) body(ctx context.Context, name, rv string) (*corev1.Secret, error) {
	st := d.store
	st.mu.Lock()
	e := st.getLocked(d.namespace, name)
	if e != nil && !e.deleted && e.data != nil && !olderThan(e.rv, rv) {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.namespace, ResourceVersion: e.rv, Labels: e.labels},
			Data: map[string][]byte{"release": e.data}}
		if e.info != nil {
			sec.Data[headInfoKey] = e.info
		}
		st.mu.Unlock()
		return sec, nil
	}
	st.mu.Unlock()
	sec, err := d.secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, err
		}
		return nil, fmt.Errorf("reading release record %s: %w", name, err)
	}
	st.remember(d.namespace, sec, false)
	return sec, nil
}
