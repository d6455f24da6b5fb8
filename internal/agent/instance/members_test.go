package instance

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// TestPhantomMembersIgnored: Leases named for holders that are not the
// cluster's pods (an ordinal at or above the StatefulSet's replicas, or
// not an ordinal), or renewed in the future, are not members; without a
// StatefulSet to read, the ordinal still has to be one.
func TestPhantomMembersIgnored(t *testing.T) {
	now := time.Now()
	lease := func(holder string, renew time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db-" + holder, Labels: map[string]string{v1alpha1.LabelCluster: "db"},
				Annotations: map[string]string{v1alpha1.AnnotationMemberAddress: holder + ".db-headless:5432", v1alpha1.AnnotationMemberTimeline: "99", v1alpha1.AnnotationMemberLSN: "FF/0"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: renew}},
		}
	}
	leases := []runtime.Object{
		lease("db-0", now), lease("db-1", now.Add(-time.Hour)), lease("db-2", now.Add(100*365*24*time.Hour)),
		lease("db-7", now), lease("db-01", now), lease("db-x", now), lease("db-", now),
	}
	for _, withSts := range []bool{true, false} {
		objs := append([]runtime.Object{}, leases...)
		want := []string{"db-0", "db-1"}
		if withSts {
			objs = append(objs, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3)}})
		} else {
			want = append(want, "db-7")
		}
		m := &Manager{cfg: Config{Cluster: "db", Namespace: "ns", Member: "db-0", Client: fake.NewClientset(objs...), Log: logr.Discard(), LeaseDuration: time.Minute, Now: time.Now}}
		got, err := m.members(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range got {
			names = append(names, o.name)
		}
		if !slices.Equal(names, want) {
			t.Errorf("StatefulSet %v: members %q, want %q", withSts, names, want)
		}
	}
}
