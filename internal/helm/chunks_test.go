package helm

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// bigRelease is a release whose record takes about mib MiB compressed
// (random text hardly compresses).
func bigRelease(t *testing.T, version int, mib int) *release.Release {
	t.Helper()
	buf := make([]byte, mib<<20)
	if _, err := rand.Read(buf); err != nil {
		t.Fatal(err)
	}
	return &release.Release{Name: "big", Namespace: "ns", Version: version,
		Manifest: "kind: ConfigMap\ndata:\n  blob: " + base64.StdEncoding.EncodeToString(buf) + "\n",
		Info:     &release.Info{Status: release.StatusDeployed, Description: "Install complete", Notes: "see the docs"},
		Labels:   map[string]string{v1alpha1.LabelOwnerKind: "Webapp", v1alpha1.LabelOwnerUID: "u1"}}
}

// chunksOf lists the chunk Secrets in the fake clientset.
func chunksOf(t *testing.T, cs *fake.Clientset) []corev1.Secret {
	t.Helper()
	list, err := cs.CoreV1().Secrets("ns").List(context.Background(), metav1.ListOptions{LabelSelector: StorageLabelOwner + "=" + StorageOwnerChunk})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func TestChunkedRecord(t *testing.T) {
	cs := fake.NewSimpleClientset()
	key := []byte("0123456789abcdef0123456789abcdef")
	secrets := cs.CoreV1().Secrets("ns")
	d := &recordDriver{secrets: secrets, namespace: "ns", opts: Records{Key: key}}
	const head = "sh.helm.release.v1.big.v1"
	rel := bigRelease(t, 1, 3)
	if err := d.Create(head, rel); err != nil {
		t.Fatal(err)
	}
	chunks := chunksOf(t, cs)
	if len(chunks) != 4 {
		t.Fatalf("%d chunks for about 4 MiB of body, want 4", len(chunks))
	}
	for _, c := range chunks {
		if n := len(c.Data[chunkDataKey]); n > chunkSize {
			t.Errorf("chunk %s holds %d bytes", c.Name, n)
		}
	}
	got, err := d.Get(head)
	if err != nil {
		t.Fatal(err)
	}
	if got.Manifest != rel.Manifest || got.Info.Status != release.StatusDeployed || got.Info.Notes != "see the docs" || got.Info.Description != "Install complete" {
		t.Fatalf("read back: status %s, notes %q, description %q, manifest equal %v", got.Info.Status, got.Info.Notes, got.Info.Description, got.Manifest == rel.Manifest)
	}
	for k := range got.Labels {
		if k == v1alpha1.LabelRecordChunks || k == v1alpha1.LabelRecordDigest {
			t.Errorf("label %s reaches the release's labels", k)
		}
	}

	// A reader that does not know chunks refuses the record.
	s, err := secrets.Get(context.Background(), head, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var re *RecordError
	if _, err := decodeRecord(head, s.Data["release"], DefaultMaxRecordSize); !errors.As(err, &re) || !re.Invalid {
		t.Errorf("a chunked record read as one Secret: %v, want it refused", err)
	}

	// A status change rewrites the record, not its chunks.
	cs.ClearActions()
	got.Info.Status = release.StatusSuperseded
	got.Labels = s.Labels
	if err := d.Update(head, got); err != nil {
		t.Fatal(err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() == "delete" {
			t.Errorf("a status change deleted %v", a)
		}
	}
	if again, err := d.Get(head); err != nil || again.Info.Status != release.StatusSuperseded || again.Manifest != rel.Manifest {
		t.Fatalf("after a status change: %v", err)
	}

	// A chunk changed, or gone, is refused naming it.
	c := chunks[1]
	c.Data[chunkDataKey][10] ^= 1
	if _, err := secrets.Update(context.Background(), &c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(head); !errors.As(err, &re) || re.Record != c.Name || re.Invalid || re.Missing || !strings.Contains(err.Error(), "no valid MAC") {
		t.Errorf("a forged chunk: %v, want a RecordError naming %s", err, c.Name)
	}
	if err := secrets.Delete(context.Background(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(head); !errors.As(err, &re) || re.Record != c.Name || !re.Missing || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing chunk: %v, want a RecordError naming %s", err, c.Name)
	}

	// Chunks no record names (a crash between the writes) go with the
	// next chunked write; a deleted record takes its chunks along.
	orphan := bigRelease(t, 2, 2)
	e, err := d.encode("sh.helm.release.v1.big.v2", orphan, "createdAt")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.writeChunks(e); err != nil {
		t.Fatal(err)
	}
	if err := d.Create("sh.helm.release.v1.big.v2", bigRelease(t, 2, 2)); err != nil {
		t.Fatal(err)
	}
	for _, c := range chunksOf(t, cs) {
		if c.Labels[v1alpha1.LabelRecordDigest] == e.digest {
			t.Errorf("orphaned chunk %s left after the next write", c.Name)
		}
	}
	purge := &recordDriver{secrets: secrets, namespace: "ns", opts: Records{Key: key}, purge: true, chunkedSeen: true}
	for _, k := range []string{head, "sh.helm.release.v1.big.v2"} {
		if _, err := purge.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	if left := chunksOf(t, cs); len(left) != 0 {
		t.Errorf("%d chunks left after every record was deleted", len(left))
	}
}

func TestChunkedRecordOverTheLimit(t *testing.T) {
	d := &recordDriver{namespace: "ns", opts: Records{MaxSize: 2 << 20}}
	_, err := d.encode("sh.helm.release.v1.big.v1", bigRelease(t, 1, 2), "createdAt")
	var tl *RecordTooLargeError
	if !errors.As(err, &tl) || !strings.Contains(err.Error(), "--max-release-record-size") {
		t.Fatalf("a record over the limit: %v", err)
	}
}

// A Secret labelled as a chunk but not named as one is never deleted.
func TestSweepDeletesOnlyChunks(t *testing.T) {
	cs := fake.NewSimpleClientset()
	secrets := cs.CoreV1().Secrets("ns")
	labels := map[string]string{StorageLabelOwner: StorageOwnerChunk, StorageLabelName: "big", StorageLabelVersion: "1",
		v1alpha1.LabelRecordDigest: "abcdefghijklmnop", v1alpha1.LabelRecordChunk: "0"}
	for _, name := range []string{"app-credentials", chunkName("sh.helm.release.v1.big.v1", "abcdefghijklmnop", 0)} {
		if _, err := secrets.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	d := &recordDriver{secrets: secrets, namespace: "ns"}
	if err := d.sweepChunks("big", true); err != nil {
		t.Fatal(err)
	}
	left := chunksOf(t, cs)
	if len(left) != 1 || left[0].Name != "app-credentials" {
		t.Errorf("after the sweep: %v, want only the Secret not named as a chunk", left)
	}
}

// With the records' cache: a status change writes no chunk; a revision
// whose record was deleted (and its chunks swept) is stored again whole,
// though this process remembers its body.
func TestChunksWrittenAgainAfterTheirRecordWent(t *testing.T) {
	cs := fake.NewSimpleClientset()
	secrets := cs.CoreV1().Secrets("ns")
	index := func(ctx context.Context, namespace string, match map[string]string) ([]metav1.ObjectMeta, error) {
		list, err := cs.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.Set(match).AsSelector().String()})
		if err != nil {
			return nil, err
		}
		out := make([]metav1.ObjectMeta, len(list.Items))
		for i := range list.Items {
			out[i] = list.Items[i].ObjectMeta
		}
		return out, nil
	}
	c := &Client{}
	c.UseRecordIndex(index)
	d := &recordDriver{secrets: secrets, namespace: "ns", opts: Records{Key: []byte("0123456789abcdef0123456789abcdef")}, index: c.recordIndex, store: c.recordStore}
	const key = "sh.helm.release.v1.big.v1"
	rel := bigRelease(t, 1, 2)
	if err := d.Create(key, rel); err != nil {
		t.Fatal(err)
	}
	n := len(chunksOf(t, cs))
	cs.ClearActions()
	rel.Info.Status = release.StatusSuperseded
	if err := d.Update(key, rel); err != nil {
		t.Fatal(err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" || a.GetVerb() == "delete" {
			t.Errorf("a status change: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	// As DeleteRevision does.
	if err := secrets.Delete(context.Background(), key, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.store.forget("ns", key)
	if err := d.sweepChunks("big", true); err != nil {
		t.Fatal(err)
	}
	if left := chunksOf(t, cs); len(left) != 0 {
		t.Fatalf("%d chunks left after their record was deleted", len(left))
	}
	if err := d.Create(key, rel); err != nil {
		t.Fatal(err)
	}
	if got := len(chunksOf(t, cs)); got != n {
		t.Fatalf("%d chunks after the revision was stored again, want %d", got, n)
	}
	fresh := &recordDriver{secrets: secrets, namespace: "ns", opts: d.opts}
	if got, err := fresh.Get(key); err != nil || got.Manifest != rel.Manifest {
		t.Fatalf("read by a process that remembers nothing: %v", err)
	}
}
