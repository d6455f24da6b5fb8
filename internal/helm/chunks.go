package helm

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"

	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// A record whose body does not fit in one Secret is stored chunked: the
// record itself (the head: Helm's name and labels, the MAC, and the
// release's Info) names its body by SHA-256 digest and chunk count, and the
// body (the release without its Info, gzipped) is cut into chunk Secrets
// named after the head and the digest. Chunks are written before the head
// and deleted after it, so a head never names a chunk not yet written; a
// crash between the writes leaves chunks no head names, which the next
// write of the release deletes.
//
// The body leaves out the Info (status, description, times), so a status
// change (every Helm action ends with one) rewrites the head only: the
// chunks of the same body keep their names.
const (
	// StorageOwnerChunk is the owner label of a chunk Secret: not Helm's,
	// so that Helm (and the helm CLI) never lists a chunk as a release.
	StorageOwnerChunk = "chartpilot-record-chunk"
	// chunkSize is the most body one chunk holds: a Secret's data is
	// limited to 1 MiB.
	chunkSize = 1000 << 10
	// chunkDataKey holds a chunk's part of the body; headInfoKey the
	// head's Info (JSON).
	chunkDataKey = "chunk"
	headInfoKey  = "info"
	// chunkType is the type of a chunk Secret.
	chunkType = "chartpilot.dev/release-chunk"
)

// chunkedRefusal is the "release" data of a chunked head, for the readers
// that do not know chunks (an older chartpilot, the helm CLI): it decodes
// (base64) to this text, which is not a release, so they refuse the record
// as unreadable instead of reading a release without objects.
var chunkedRefusal = []byte(base64.StdEncoding.EncodeToString([]byte(
	"this release record is stored in chunks (label " + v1alpha1.LabelRecordChunks + "): only a chartpilot that reads chunked records can read it")))

// encoded is a record ready to write: its Secret, and for a chunked record
// its chunks and the body they hold.
type encoded struct {
	head   *corev1.Secret
	chunks []*corev1.Secret
	body   []byte
	digest string
}

// chunked reports whether the record is stored in chunks.
func (e *encoded) chunked() bool { return len(e.chunks) > 0 }

// encodeChunked builds the head and chunks of rel, whose record labels
// (without a MAC) are l.
func (d *recordDriver) encodeChunked(key string, rel *release.Release, l map[string]string) (*encoded, error) {
	info := release.Info{}
	notes := ""
	if rel.Info != nil {
		info = *rel.Info
		notes = info.Notes
	}
	info.Notes, info.Resources = "", nil
	body := *rel
	body.Info = &release.Info{Notes: notes}
	raw, err := json.Marshal(&body)
	if err != nil {
		return nil, fmt.Errorf("encoding release %s: %w", rel.Name, err)
	}
	gz, err := gzipped(raw)
	if err != nil {
		return nil, err
	}
	infoJSON, err := json.Marshal(&info)
	if err != nil {
		return nil, fmt.Errorf("encoding release %s: %w", rel.Name, err)
	}
	digest := digestOf(gz)
	n := (len(gz) + chunkSize - 1) / chunkSize
	l[v1alpha1.LabelRecordChunks], l[v1alpha1.LabelRecordDigest] = strconv.Itoa(n), digest
	if d.opts.Key != nil {
		l[v1alpha1.LabelRecordMAC] = d.mac(rel, l)
	}
	out := &encoded{
		head: &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: key, Labels: l},
			Type:       "helm.sh/release.v1",
			Data:       map[string][]byte{"release": chunkedRefusal, headInfoKey: infoJSON},
		},
		body: gz, digest: digest,
	}
	for i := range n {
		part := gz[i*chunkSize : min(len(gz), (i+1)*chunkSize)]
		cl := map[string]string{
			StorageLabelOwner: StorageOwnerChunk, StorageLabelName: rel.Name, StorageLabelVersion: strconv.Itoa(rel.Version),
			v1alpha1.LabelRecordDigest: digest, v1alpha1.LabelRecordChunk: strconv.Itoa(i),
		}
		// The owner's kind and UID, so that a change to a chunk wakes the
		// resource the record is of.
		for _, k := range []string{v1alpha1.LabelOwnerKind, v1alpha1.LabelOwnerUID} {
			if v, ok := rel.Labels[k]; ok {
				cl[k] = v
			}
		}
		if d.opts.Key != nil {
			cl[v1alpha1.LabelRecordMAC] = d.chunkMAC(key, digest, i, n, part)
		}
		out.chunks = append(out.chunks, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: chunkName(key, digest, i), Labels: cl},
			Type:       chunkType,
			Data:       map[string][]byte{chunkDataKey: part},
		})
	}
	return out, nil
}

// chunkName is the name of chunk i of the body with this digest of record
// key: a different body of the same revision has other chunks.
func chunkName(key, digest string, i int) string {
	return fmt.Sprintf("%s.%s.%d", key, digest[:min(len(digest), 12)], i)
}

// digestOf is the SHA-256 of b in base32, lower case (a label value).
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
}

// chunkMAC signs chunk i of n of the body with this digest of record key.
func (d *recordDriver) chunkMAC(key, digest string, i, n int, part []byte) string {
	h := hmac.New(sha256.New, d.opts.Key)
	sum := sha256.Sum256(part)
	fmt.Fprintf(h, "chunk\x00%s\x00%s\x00%s\x00%d\x00%d\x00", d.namespace, key, digest, i, n)
	h.Write(sum[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)))
}

// maxChunks is the most chunks a record within the size limit max (of its
// decompressed body) can have: gzip adds a few bytes per block at worst.
func maxChunks(max int64) int {
	return int((max+max/64+64<<10)/chunkSize) + 1
}

// writeChunks creates the chunks of e, unless the record it replaces names
// the same body (a status change: its chunks are there, and the sweep
// keeps what a record names). A chunk already there under its name (left
// by an attempt broken off) is kept if it holds what e's does and carries
// its MAC, else overwritten.
func (d *recordDriver) writeChunks(e *encoded) error {
	if !e.chunked() || d.namesBody(e.head.Name, e.digest) {
		return nil
	}
	ctx := context.Background()
	for _, c := range e.chunks {
		_, err := d.secrets.Create(ctx, c, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = d.replaceChunk(ctx, c)
		}
		if err != nil {
			return fmt.Errorf("creating release record chunk %s: %w", c.Name, err)
		}
	}
	d.store.rememberBody(d.namespace, e.head.Name, e.digest, e.body)
	return nil
}

// namesBody reports whether record key, as the records' cache (merged with
// this process's writes) shows it, names the body with this digest; false
// without a cache.
func (d *recordDriver) namesBody(key, digest string) bool {
	name, _, ok := parseRecordKey(key)
	if !ok || d.index == nil {
		return false
	}
	metas, err := d.current(context.Background(), labels.Set{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: name})
	if err != nil {
		return false
	}
	for _, m := range metas {
		if m.name == key {
			return m.labels[v1alpha1.LabelRecordDigest] == digest
		}
	}
	return false
}

// replaceChunk makes the chunk Secret named like c hold c.
func (d *recordDriver) replaceChunk(ctx context.Context, c *corev1.Secret) error {
	got, err := d.secrets.Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got.DeletionTimestamp == nil && got.Type == c.Type && bytes.Equal(got.Data[chunkDataKey], c.Data[chunkDataKey]) && maps.Equal(got.Labels, c.Labels) {
		return nil
	}
	if got.DeletionTimestamp != nil {
		return fmt.Errorf("a Secret of that name is being deleted")
	}
	got.Labels, got.Data = c.Labels, c.Data
	_, err = d.secrets.Update(ctx, got, metav1.UpdateOptions{})
	return err
}

// decodeChunked reads the body of chunked head s from its chunks (or from
// memory) and returns the release it holds, with the head's Info.
func (d *recordDriver) decodeChunked(s *corev1.Secret) (*release.Release, error) {
	max := d.opts.maxSize()
	n, err := strconv.Atoi(s.Labels[v1alpha1.LabelRecordChunks])
	if err != nil || n < 1 {
		return nil, &RecordError{Record: s.Name, Invalid: true, err: fmt.Errorf("label %s=%q is not a chunk count", v1alpha1.LabelRecordChunks, s.Labels[v1alpha1.LabelRecordChunks])}
	}
	if n > maxChunks(max) {
		return nil, &RecordError{Record: s.Name, TooLarge: true, limit: max}
	}
	digest := s.Labels[v1alpha1.LabelRecordDigest]
	body, err := d.readBody(s.Name, digest, n, max)
	if err != nil {
		return nil, err
	}
	rel, err := decodeBody(s.Name, body, max)
	if err != nil {
		return nil, err
	}
	var info release.Info
	if err := json.Unmarshal(s.Data[headInfoKey], &info); err != nil {
		return nil, &RecordError{Record: s.Name, Invalid: true, err: fmt.Errorf("its info: %w", err)}
	}
	if rel.Info != nil {
		info.Notes = rel.Info.Notes
	}
	rel.Info = &info
	return rel, nil
}

// readBody returns the body of record key with this digest in n chunks:
// from memory, or read chunk by chunk, each checked against its MAC, the
// whole against the digest. A missing or forged chunk is a *RecordError
// naming it.
func (d *recordDriver) readBody(key, digest string, n int, max int64) ([]byte, error) {
	if b := d.store.body(d.namespace, key, digest); b != nil {
		return b, nil
	}
	// Grown as chunks check out: the count is the record's claim.
	var body []byte
	for i := range n {
		name := chunkName(key, digest, i)
		c, err := d.secrets.Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, &RecordError{Record: name, Missing: true, of: key}
		}
		if err != nil {
			return nil, fmt.Errorf("reading release record chunk %s: %w", name, err)
		}
		part := c.Data[chunkDataKey]
		if len(part) > chunkSize {
			return nil, &RecordError{Record: name, Invalid: true, err: fmt.Errorf("it holds %d bytes, more than a chunk holds", len(part))}
		}
		if d.opts.Key != nil && !hmac.Equal([]byte(d.chunkMAC(key, digest, i, n, part)), []byte(c.Labels[v1alpha1.LabelRecordMAC])) {
			return nil, &RecordError{Record: name, of: key}
		}
		body = append(body, part...)
	}
	if digestOf(body) != digest {
		return nil, &RecordError{Record: key, Invalid: true, err: errors.New("its chunks do not hold the body its digest names")}
	}
	d.store.rememberBody(d.namespace, key, digest, body)
	return body, nil
}

// maxSweep bounds the requests of one sweep: more chunks to delete wait
// for the next write of the release.
const maxSweep = 64

// sweepChunks deletes the chunks of release name that no record names:
// left by a crash between a chunked record's writes, or by a record that
// was deleted or rewritten. With the records' cache it costs nothing when
// there are none; without one it lists the chunks, so it runs only when
// asked (maybe: a chunked record was written or deleted). It is garbage
// collection: an error leaves the chunks for the next write of the release
// (callers do not fail on it).
func (d *recordDriver) sweepChunks(name string, maybe bool) error {
	ctx := context.Background()
	chunkSet := labels.Set{StorageLabelOwner: StorageOwnerChunk, StorageLabelName: name}
	var chunks []metav1.ObjectMeta
	if d.index != nil {
		var err error
		if chunks, err = d.index(ctx, d.namespace, chunkSet); err != nil {
			return fmt.Errorf("listing release record chunks from the cache: %w", err)
		}
	} else {
		if !maybe {
			return nil
		}
		list, err := d.secrets.List(ctx, metav1.ListOptions{LabelSelector: chunkSet.AsSelector().String()})
		if err != nil {
			return fmt.Errorf("listing release record chunks: %w", err)
		}
		for _, c := range list.Items {
			chunks = append(chunks, c.ObjectMeta)
		}
	}
	if len(chunks) == 0 {
		return nil
	}
	named, err := d.namedBodies(name)
	if err != nil {
		return err
	}
	confirmed := map[string]string{}
	requests := 0
	for _, c := range chunks {
		// The revision and body a chunk is of come from its name, which
		// no update changes: labels could be put on any Secret.
		version, prefix, ok := parseChunkName(name, c.Name)
		if !ok || c.DeletionTimestamp != nil || strings.HasPrefix(named[version], prefix) {
			continue
		}
		if requests >= maxSweep {
			break
		}
		// What the cache shows may lag: the record itself decides.
		head, seen := confirmed[version]
		if !seen {
			key := fmt.Sprintf("sh.helm.release.v1.%s.v%s", name, version)
			s, err := d.secrets.Get(ctx, key, metav1.GetOptions{})
			requests++
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return fmt.Errorf("reading release record %s: %w", key, err)
			default:
				head = s.Labels[v1alpha1.LabelRecordDigest]
			}
			confirmed[version] = head
		}
		if strings.HasPrefix(head, prefix) {
			continue
		}
		requests++
		if err := d.secrets.Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting release record chunk %s: %w", c.Name, err)
		}
	}
	return nil
}

// parseChunkName reads the revision and the digest's prefix from the name
// of a chunk of release name (chunkName); false for any other name.
func parseChunkName(name, chunk string) (version, prefix string, ok bool) {
	rest, ok := strings.CutPrefix(chunk, "sh.helm.release.v1."+name+".v")
	if !ok {
		return "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || len(parts[1]) != 12 {
		return "", "", false
	}
	for _, p := range []string{parts[0], parts[2]} {
		if _, err := strconv.ParseUint(p, 10, 32); err != nil {
			return "", "", false
		}
	}
	return parts[0], parts[1], true
}

// namedBodies maps each revision of release name to the digest of the
// body its record names ("" for a record in one Secret).
func (d *recordDriver) namedBodies(name string) (map[string]string, error) {
	set := labels.Set{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: name}
	out := map[string]string{}
	if d.index != nil {
		metas, err := d.current(context.Background(), set)
		if err != nil {
			return nil, err
		}
		for _, m := range metas {
			out[m.labels[StorageLabelVersion]] = m.labels[v1alpha1.LabelRecordDigest]
		}
		return out, nil
	}
	items, err := d.list(set)
	if err != nil {
		return nil, err
	}
	for _, s := range items {
		out[s.Labels[StorageLabelVersion]] = s.Labels[v1alpha1.LabelRecordDigest]
	}
	return out, nil
}

// bodies remembers the chunked bodies this process wrote or read (each
// checked against its digest), by namespace, record and digest, up to a
// total size: a pass reads its release's newest record again and again,
// and reading megabytes of chunks each time would cost more than the rest.
type bodies struct {
	mu    sync.Mutex
	m     map[string][]byte
	order []string
	size  int
}

// maxRememberedBodies bounds the bodies kept in memory, in bytes.
const maxRememberedBodies = 48 << 20

func bodyKey(namespace, key, digest string) string { return namespace + "/" + key + "@" + digest }

func (b *bodies) get(k string) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[k]
}

func (b *bodies) put(k string, body []byte) {
	if len(body) > maxRememberedBodies/4 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string][]byte{}
	}
	if _, ok := b.m[k]; ok {
		return
	}
	for b.size+len(body) > maxRememberedBodies && len(b.order) > 0 {
		b.size -= len(b.m[b.order[0]])
		delete(b.m, b.order[0])
		b.order = b.order[1:]
	}
	b.m[k], b.order, b.size = body, append(b.order, k), b.size+len(body)
}

// body returns a remembered body (nil when none; always nil without a store).
func (s *recordStore) body(namespace, key, digest string) []byte {
	if s == nil {
		return nil
	}
	return s.bodies.get(bodyKey(namespace, key, digest))
}

func (s *recordStore) rememberBody(namespace, key, digest string, body []byte) {
	if s != nil {
		s.bodies.put(bodyKey(namespace, key, digest), bytes.Clone(body))
	}
}
