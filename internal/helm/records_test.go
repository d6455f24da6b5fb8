package helm

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"

	"helm.sh/helm/v3/pkg/release"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
)

func TestRecordMACAndSizeLimit(t *testing.T) {
	d := &recordDriver{namespace: "ns", opts: Records{Key: []byte("0123456789abcdef0123456789abcdef"), MaxSize: 1 << 20}}
	for i := range 200 {
		rel := &release.Release{Name: "web", Version: i + 1, Manifest: fmt.Sprintf("kind: ConfigMap # %d", i), Info: &release.Info{Status: release.StatusDeployed},
			Labels: map[string]string{"chartpilot.dev/started-at": fmt.Sprint(1700000000 + i)}}
		e, err := d.encode("sh.helm.release.v1.web.v1", rel, "createdAt")
		if err != nil {
			t.Fatal(err)
		}
		s := e.head
		for k, v := range s.Labels {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Fatalf("label %s=%q is not a valid label value: %v", k, v, errs)
			}
		}
		got, trusted, err := d.decode(s)
		if err != nil || !trusted || got.Manifest != rel.Manifest {
			t.Fatalf("a record chartpilot wrote: trusted %v, %v", trusted, err)
		}
		if i == 0 {
			edited := s.DeepCopy()
			edited.Labels["chartpilot.dev/owner-uid"] = "someone-else"
			if _, trusted, _ := d.decode(edited); trusted {
				t.Error("a record with an edited chartpilot label is trusted")
			}
			other := &recordDriver{namespace: "ns", opts: Records{Key: []byte("another key of thirty-two bytes!")}}
			if _, trusted, _ := other.decode(s); trusted {
				t.Error("a record signed with another key is trusted")
			}
		}
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(make([]byte, 4<<20))
	_ = zw.Close()
	_, err := decodeRecord("bomb", []byte(base64.StdEncoding.EncodeToString(buf.Bytes())), 1<<20)
	var re *RecordError
	if !errors.As(err, &re) || !re.TooLarge {
		t.Fatalf("a record inflating to 4 MiB with a 1 MiB limit: %v", err)
	}
	for _, bad := range []string{"not base64!", base64.StdEncoding.EncodeToString([]byte{0x1f, 0x8b, 0x08, 0}), base64.StdEncoding.EncodeToString([]byte("{not json"))} {
		_, err := decodeRecord("broken", []byte(bad), 1<<20)
		if !errors.As(err, &re) || !re.Invalid || re.TooLarge {
			t.Errorf("record %q: %v, want an Invalid RecordError", bad, err)
		}
	}
}

// A purge reads only the newest record of its release: an older record
// that fails its MAC is deleted unread, the "uninstalling" mark is not
// stored, and records are deleted without being read first. Outside a
// purge the same older record is refused.
func TestPurgeReadsOnlyTheNewestRecord(t *testing.T) {
	cs := fake.NewSimpleClientset()
	key := []byte("0123456789abcdef0123456789abcdef")
	d := &recordDriver{secrets: cs.CoreV1().Secrets("ns"), namespace: "ns", opts: Records{Key: key}}
	rel := func(v int, st release.Status) *release.Release {
		return &release.Release{Name: "web", Namespace: "ns", Version: v, Manifest: fmt.Sprintf("# %d", v), Info: &release.Info{Status: st}}
	}
	for v, st := range map[int]release.Status{1: release.StatusSuperseded, 2: release.StatusDeployed} {
		if err := d.Create(fmt.Sprintf("sh.helm.release.v1.web.v%d", v), rel(v, st)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	old, err := cs.CoreV1().Secrets("ns").Get(ctx, "sh.helm.release.v1.web.v1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Signed with another key: its MAC does not hold here.
	other := &recordDriver{namespace: "ns", opts: Records{Key: []byte("another key of thirty-two bytes!")}}
	forged, err := other.encode(old.Name, rel(1, release.StatusSuperseded), "createdAt")
	if err != nil {
		t.Fatal(err)
	}
	old.Labels, old.Data = forged.head.Labels, forged.head.Data
	if _, err := cs.CoreV1().Secrets("ns").Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	set := map[string]string{StorageLabelOwner: StorageOwnerHelm, StorageLabelName: "web"}
	var re *RecordError
	if _, err := d.Query(set); !errors.As(err, &re) || re.Record != old.Name {
		t.Fatalf("outside a purge, the edited older record: %v, want a RecordError naming it", err)
	}

	purge := &recordDriver{secrets: cs.CoreV1().Secrets("ns"), namespace: "ns", opts: Records{Key: key}, purge: true}
	rels, err := purge.Query(set)
	if err != nil || len(rels) != 2 {
		t.Fatalf("purge history: %d releases, %v", len(rels), err)
	}
	for _, r := range rels {
		if r.Version == 2 && r.Manifest != "# 2" {
			t.Errorf("the newest revision was not read whole: %+v", r)
		}
		if r.Version == 1 && r.Manifest != "" {
			t.Errorf("the older revision was read: %q", r.Manifest)
		}
	}
	cs.ClearActions()
	newest := rel(2, release.StatusUninstalling)
	if err := purge.Update("sh.helm.release.v1.web.v2", newest); err != nil {
		t.Fatal(err)
	}
	for _, v := range []int{1, 2} {
		if _, err := purge.Delete(fmt.Sprintf("sh.helm.release.v1.web.v%d", v)); err != nil {
			t.Fatal(err)
		}
	}
	var verbs []string
	for _, a := range cs.Actions() {
		verbs = append(verbs, a.GetVerb())
	}
	if fmt.Sprint(verbs) != "[delete delete]" {
		t.Errorf("purge requests: %v, want [delete delete]", verbs)
	}
}
