package helm

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"

	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestRecordMACAndSizeLimit(t *testing.T) {
	d := &recordDriver{namespace: "ns", opts: Records{Key: []byte("0123456789abcdef0123456789abcdef"), MaxSize: 1 << 20}}
	for i := range 200 {
		rel := &release.Release{Name: "web", Version: i + 1, Manifest: fmt.Sprintf("kind: ConfigMap # %d", i), Info: &release.Info{Status: release.StatusDeployed},
			Labels: map[string]string{"chartpilot.dev/started-at": fmt.Sprint(1700000000 + i)}}
		s, err := d.encode("sh.helm.release.v1.web.v1", rel, "createdAt")
		if err != nil {
			t.Fatal(err)
		}
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
