package instance

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// TestForgedMemberLeasesIgnored: Leases that carry the cluster's label
// but are not named for their holder, and member addresses that would add
// keywords to primary_conninfo, change nothing the manager acts on.
func TestForgedMemberLeasesIgnored(t *testing.T) {
	now := time.Now()
	lease := func(name, holder, address string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{v1alpha1.LabelCluster: "db"},
				Annotations: map[string]string{v1alpha1.AnnotationMemberAddress: address, v1alpha1.AnnotationMemberRole: RolePrimary}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: now}},
		}
	}
	cs := fake.NewClientset(
		lease("db-db-0", "db-0", "db-0.db-headless:5432"),
		lease("db-db-1", "db-1", "db-1.db-headless:5432 host=evil.example sslmode=disable"),
		lease("db-other", "db-0", "evil.example:5432"),
		lease("db-db-2", "db-2", "10.0.0.7:5432"),
		lease("db-db-3", "db-3", "$(touch /tmp/x):5432"),
	)
	m := &Manager{cfg: Config{Cluster: "db", Namespace: "ns", Member: "db-0", Client: cs, Log: logr.Discard(), LeaseDuration: time.Minute, Now: time.Now}}
	got, err := m.members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"db-0": "db-0.db-headless:5432", "db-1": "", "db-2": "10.0.0.7:5432", "db-3": ""}
	if len(got) != len(want) {
		t.Fatalf("members %+v, want %d (the Lease not named for its holder left out)", got, len(want))
	}
	for _, o := range got {
		if a, ok := want[o.name]; !ok || o.address != a {
			t.Errorf("member %s: address %q, want %q", o.name, o.address, a)
		}
	}
	for _, bad := range []string{"", "host", "h:0", "h:x", "a b:1", "h:1 password=x"} {
		if checkAddress(bad) == nil {
			t.Errorf("checkAddress(%q) accepted it", bad)
		}
	}
}
