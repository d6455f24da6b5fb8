package helm

// The encoding of release records: Helm's (base64 of gzipped JSON), with
// chartpilot's MAC and size limit (chunks.go for records too large for
// one Secret).

import (
	"bytes"
	"compress/gzip"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// gzipWriters are reused: a writer at the best compression allocates about
// a megabyte of tables, which for every record written made up a third of
// all the operator allocated during an upgrade wave.
var gzipWriters = sync.Pool{New: func() any {
	zw, _ := gzip.NewWriterLevel(io.Discard, gzip.BestCompression)
	return zw
}}

// gzipReaders are reused: a new reader allocates its decompressor's
// tables (about 40 KiB), and the health gate and drift check read the
// newest record on every pass that looks at a settling release.
var gzipReaders sync.Pool

// encode builds the Secret of a record (and, for a record too large for
// one Secret, its chunks), signed when there is a key. A record larger
// than the size limit on reading is refused: it could not be read back.
func (d *recordDriver) encode(key string, rel *release.Release, stamp string) (*encoded, error) {
	raw, err := json.Marshal(rel)
	if err != nil {
		return nil, fmt.Errorf("encoding release %s: %w", rel.Name, err)
	}
	if max := d.opts.maxSize(); int64(len(raw)) > max {
		return nil, &RecordTooLargeError{Release: rel.Name, Size: len(raw), Limit: max}
	}
	l := map[string]string{}
	for k, v := range rel.Labels {
		l[k] = v
	}
	l[StorageLabelName], l[StorageLabelOwner] = rel.Name, StorageOwnerHelm
	l[StorageLabelStatus], l[StorageLabelVersion] = rel.Info.Status.String(), strconv.Itoa(rel.Version)
	l[stamp] = strconv.FormatInt(time.Now().Unix(), 10)
	delete(l, v1alpha1.LabelRecordMAC)
	delete(l, v1alpha1.LabelRecordChunks)
	delete(l, v1alpha1.LabelRecordDigest)
	gz, err := gzipped(raw)
	if err != nil {
		return nil, err
	}
	data := base64.StdEncoding.EncodeToString(gz)
	if len(data) > MaxStoredRecord {
		return d.encodeChunked(key, rel, l)
	}
	if d.opts.Key != nil {
		l[v1alpha1.LabelRecordMAC] = d.mac(rel, l)
	}
	return &encoded{head: &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key, Labels: l},
		Type:       "helm.sh/release.v1",
		Data:       map[string][]byte{"release": []byte(data)},
	}}, nil
}

// gzipped compresses b at the best compression.
func gzipped(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	zw.Reset(&buf)
	_, werr := zw.Write(b)
	cerr := zw.Close()
	gzipWriters.Put(zw)
	if err := errors.Join(werr, cerr); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decode reads a record within the size limit, and whether its MAC holds
// (always true without a key).
func (d *recordDriver) decode(s *corev1.Secret) (*release.Release, bool, error) {
	var rel *release.Release
	var err error
	if _, chunked := s.Labels[v1alpha1.LabelRecordChunks]; chunked {
		rel, err = d.decodeChunked(s)
	} else {
		rel, err = decodeRecord(s.Name, s.Data["release"], d.opts.maxSize())
	}
	if err != nil {
		return nil, false, err
	}
	if d.opts.Key == nil {
		return rel, true, nil
	}
	want := d.mac(rel, s.Labels)
	return rel, hmac.Equal([]byte(want), []byte(s.Labels[v1alpha1.LabelRecordMAC])), nil
}

// decodeRecord decodes base64(gzip(json)) without decompressing more than max bytes.
func decodeRecord(name string, data []byte, max int64) (*release.Release, error) {
	invalid := func(err error) error { return &RecordError{Record: name, Invalid: true, err: err} }
	gz, err := base64.StdEncoding.DecodeString(string(data))
	if err != nil {
		return nil, invalid(err)
	}
	return decodeBody(name, gz, max)
}

// decodeBody decodes gzip(json) (or json) without decompressing more than
// max bytes.
func decodeBody(name string, gz []byte, max int64) (*release.Release, error) {
	invalid := func(err error) error { return &RecordError{Record: name, Invalid: true, err: err} }
	var r io.Reader = bytes.NewReader(gz)
	if len(gz) > 3 && bytes.Equal(gz[:3], []byte{0x1f, 0x8b, 0x08}) {
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		if zr == nil {
			zr = new(gzip.Reader)
		}
		// A pooled reader keeps what it last read (in this process's
		// memory, which holds decoded records anyway) until it is reset
		// for the next record; nothing of it reaches that record.
		defer gzipReaders.Put(zr)
		if err := zr.Reset(r); err != nil {
			return nil, invalid(err)
		}
		r = zr
	}
	raw, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, invalid(err)
	}
	if int64(len(raw)) > max {
		return nil, &RecordError{Record: name, TooLarge: true, limit: max}
	}
	var rel release.Release
	if err := json.Unmarshal(raw, &rel); err != nil {
		return nil, invalid(err)
	}
	return &rel, nil
}

// mac signs what a record makes chartpilot do: where it is, which revision
// and status, chartpilot's labels on it, and the objects it applies.
func (d *recordDriver) mac(rel *release.Release, l map[string]string) string {
	h := hmac.New(sha256.New, d.opts.Key)
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s\x00", d.namespace, rel.Name, rel.Version, rel.Info.Status)
	keys := make([]string, 0, len(l))
	for k := range l {
		if strings.HasPrefix(k, "chartpilot.dev/") && k != v1alpha1.LabelRecordMAC {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%s=%s\x00", k, l[k])
	}
	objects := sha256.New()
	objects.Write([]byte(rel.Manifest))
	for _, hk := range rel.Hooks {
		if hk != nil {
			fmt.Fprintf(objects, "\x00%s\x00%s", hk.Path, hk.Manifest)
		}
	}
	h.Write(objects.Sum(nil))
	// Base32 in lower case: letters and digits only, as a label value must
	// begin and end with one (52 characters, under the 63 allowed).
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)))
}

// userLabels drops the labels the storage itself sets, as Helm's Get does.
func userLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		switch k {
		case StorageLabelName, StorageLabelOwner, StorageLabelStatus, StorageLabelVersion, "createdAt", "modifiedAt",
			v1alpha1.LabelRecordChunks, v1alpha1.LabelRecordDigest:
		default:
			out[k] = v
		}
	}
	return out
}
