package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
)

// TestMajorUpgradeOnRealPods: a Postgres 15 on the real node, an
// application writing rows as its own role through the read-write Service
// throughout, is moved to PostgreSQL 17 by the operator as installed: the
// backup before it stored by a real Job to the S3 server, the data moved
// by the major-upgrade Job (PostgreSQL 17's image, the agent copied in),
// the StatefulSet replaced onto the new volume. Every row the application
// saw acknowledged is on the 17 server, none by the 15 server after the
// writes were stopped, the seeded table's rows and checksum are equal, and
// the old claim is kept with its 15 data.
func TestMajorUpgradeOnRealPods(t *testing.T) {
	ctx := context.Background()
	cs, dyn := clients(t)
	pgRepo, _ := postgresImages(t)
	_, tenant := operatorWithStore(t, map[string]any{"postgresImage": pgRepo})
	const name = "up"
	createThroughWebhook(t, dyn, postgresGVR, tenant, "Postgres", name, realNodePostgres(pgRepo, "15", map[string]any{
		"backup": map[string]any{"store": map[string]any{"name": "local"}, "schedule": "0 3 * * *"},
	}))
	waitReady(t, dyn, postgresGVR, tenant, name, "True", 6*time.Minute)
	for _, sql := range []string{
		"CREATE ROLE app LOGIN PASSWORD 'app-secret'",
		"CREATE DATABASE app OWNER app",
	} {
		superQuery(t, tenant, name, "postgres", sql)
	}
	superQuery(t, tenant, name, "app", "SET ROLE app; CREATE TABLE t (v int PRIMARY KEY); CREATE TABLE seeded AS SELECT g AS id, md5(g::text) AS note FROM generate_series(1, 20000) g")
	fillMB(t, tenant, name, "app", *dataMB)
	const sum = "SELECT count(*) || ' ' || md5(string_agg(id || note, ',' ORDER BY id)) FROM seeded"
	want := superQuery(t, tenant, name, "app", sum)

	host := serviceIP(t, cs, tenant, name)
	w := startRowWriter(t, host, "app", "app-secret", "app", 1)
	w.waitAcks(t, "20 rows acknowledged on 15", 2*time.Minute, func(a []ack) bool { return len(a) >= 20 })
	// on: acknowledged by a server of major (server_version_num 150012: 15).
	on := func(a ack, major string) bool {
		return strings.HasPrefix(a.server[strings.LastIndex(a.server, "/")+1:], major)
	}
	patch := `{"metadata":{"annotations":{"chartpilot.dev/allow-major-upgrade":"17"}},"spec":{"version":"17"}}`
	if _, err := dyn.Resource(postgresGVR).Namespace(tenant).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	var st v1alpha1.PostgresStatus
	var last string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(postgresGVR).Namespace(tenant).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		b, _ := json.Marshal(u.Object["status"])
		st = v1alpha1.PostgresStatus{}
		_ = json.Unmarshal(b, &st)
		ready, msg := condition(u, "Ready")
		last = fmt.Sprintf("Ready=%s (%s), majorUpgrade %+v", ready, msg, st.MajorUpgrade)
		if st.MajorUpgrade != nil && st.MajorUpgrade.Phase == "Failed" {
			t.Fatalf("the major upgrade failed: %s", last)
		}
		n := 0
		for _, a := range w.snapshot() {
			if on(a, "17") {
				n++
			}
		}
		return st.MajorUpgrade != nil && st.MajorUpgrade.Phase == "Completed" && ready == "True" && n >= 20, nil
	})
	if err != nil {
		t.Fatalf("not on 17 and written to within 15 minutes: %s; %d rows acknowledged", last, len(w.snapshot()))
	}
	acks := w.halt()
	var last15, first17 ack
	for _, a := range acks {
		switch {
		case on(a, "15"):
			last15 = a
		case on(a, "17") && first17.server == "":
			first17 = a
		}
		if !on(a, "15") && !on(a, "17") {
			t.Errorf("row %d acknowledged by %s", a.v, a.server)
		}
	}
	rows := superQuery(t, tenant, name, "app", "SELECT string_agg(v::text, ' ') FROM t")
	lost, _ := lostOf(acks, rows)
	t.Logf("15 → 17 in %s (from the patch to the first row on 17); writes refused for %s (the last row on 15 to the first on 17); %d of %d acknowledged rows lost; the Job compared %d tables, %d rows",
		first17.at.Sub(asked).Round(time.Second), first17.at.Sub(last15.at).Round(time.Second), lost, len(acks), st.MajorUpgrade.Tables, st.MajorUpgrade.Rows)
	if lost != 0 {
		t.Errorf("%d acknowledged rows lost", lost)
	}
	size := superQuery(t, tenant, name, "postgres", "SELECT sum(pg_database_size(datname)) FROM pg_database")
	report(t, "major", map[string]any{"bytes": size, "seconds": first17.at.Sub(asked).Seconds(), "refusedSeconds": first17.at.Sub(last15.at).Seconds(),
		"acked": len(acks), "lost": lost, "tables": st.MajorUpgrade.Tables, "rows": st.MajorUpgrade.Rows})
	if v := superQuery(t, tenant, name, "postgres", "SHOW server_version_num"); !strings.HasPrefix(v, "17") {
		t.Errorf("server_version_num %s after the upgrade", v)
	}
	if got := superQuery(t, tenant, name, "app", sum); got != want {
		t.Errorf("the seeded table: %s on 17, %s on 15", got, want)
	}
	if st.DataVolume == nil || st.DataVolume.Major != "17" || st.PreviousVolume == nil || st.PreviousVolume.Major != "15" {
		t.Errorf("status.dataVolume %+v, previousVolume %+v", st.DataVolume, st.PreviousVolume)
	}
	for _, claim := range st.PreviousVolume.Claims {
		pvc, err := cs.CoreV1().PersistentVolumeClaims(tenant).Get(ctx, claim, metav1.GetOptions{})
		if err != nil || pvc.DeletionTimestamp != nil {
			t.Errorf("the old claim %s was not kept: %v", claim, err)
			continue
		}
		// The test cluster's volumes are directories of this machine.
		pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.HostPath == nil {
			t.Fatalf("the volume of %s: %v", claim, err)
		}
		if b, err := os.ReadFile(filepath.Join(pv.Spec.HostPath.Path, "pgdata", "PG_VERSION")); err != nil || strings.TrimSpace(string(b)) != "15" {
			t.Errorf("the old volume's PG_VERSION: %q, %v", b, err)
		}
	}
	pod, err := cs.CoreV1().Pods(tenant).Get(ctx, name+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName != st.DataVolume.Name+"-"+name+"-0" {
			t.Errorf("pod %s mounts claim %s, want %s-%s-0", pod.Name, v.PersistentVolumeClaim.ClaimName, st.DataVolume.Name, name)
		}
	}
}
