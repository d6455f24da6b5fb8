package nodes

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

var postgresGVR = schema.GroupVersionResource{Group: "chartpilot.dev", Version: "v1alpha1", Resource: "postgres"}

// clientTools are PostgreSQL 15's client programs that the PostgreSQL 17
// image links into 17's bin directory (the npm registry's server binaries
// have none). pg_isready and psql serve any server major; pg_dump,
// pg_dumpall and pg_basebackup of 15 refuse a 17 server, so replicas and
// backups of the 17 image are out of its reach.
var clientTools = []string{"pg_isready", "psql", "pg_dump", "pg_dumpall", "pg_restore", "pg_basebackup"}

// postgresImages pushes the PostgreSQL images made from hack/images.sh's
// postgresql root filesystem (Debian's packages): debian/postgresql:15,
// debian/postgresql:17 (PostgreSQL 17's server binaries from
// bin/postgresql/17 over it) and debian/postgres-exporter:bookworm (the same
// files, Debian's prometheus-postgres-exporter as the entrypoint). It
// returns the two repositories.
func postgresImages(t *testing.T) (postgres, exporter string) {
	t.Helper()
	rootfs := rootFS(t, "postgresql")
	config := v1.Config{Env: []string{debianPath}}
	if _, err := cluster.Registry.PushRootFS("debian/postgresql:15", rootfs, config); err != nil {
		t.Fatal(err)
	}
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := testcluster.TreeFiles(filepath.Join(root, "bin", "postgresql", "17"), "/usr/lib/postgresql/17")
	if err != nil {
		t.Fatalf("PostgreSQL 17's server binaries (run make tools): %v", err)
	}
	for _, tool := range clientTools {
		files = append(files, testcluster.File{Path: "/usr/lib/postgresql/17/bin/" + tool, Link: "../../15/bin/" + tool})
	}
	layer, err := testcluster.Layer(files)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Registry.PushRootFS("debian/postgresql:17", rootfs, config, layer); err != nil {
		t.Fatal(err)
	}
	exporterConfig := v1.Config{Env: []string{debianPath}, Entrypoint: []string{"/usr/bin/prometheus-postgres-exporter"}}
	if _, err := cluster.Registry.PushRootFS("debian/postgres-exporter:bookworm", rootfs, exporterConfig); err != nil {
		t.Fatal(err)
	}
	return cluster.Registry.Host + "/debian/postgresql", cluster.Registry.Host + "/debian/postgres-exporter"
}

// psql runs sql as user with password against host:5432 with this
// machine's psql and returns the unaligned, tuples-only output.
func psql(t *testing.T, host, user, password, sql string) (string, error) {
	t.Helper()
	return psqlIn(t, host, user, password, "postgres", sql)
}

// psqlIn is psql in database db.
func psqlIn(t *testing.T, host, user, password, db, sql string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(testpg.Bin(t), "psql"), "-h", host, "-p", "5432", "-U", user, "-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql)
	cmd.Env = []string{"PGPASSWORD=" + password, "PGCONNECT_TIMEOUT=10", "PGSSLMODE=require"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// TestPostgresSampleOnRealPods: config/samples/postgres.yaml (PostgreSQL
// 17) with the exporter, its images from Debian's packages, on the real
// node. Ready only once the server answers through its Service; the
// server runs the chart's rendered postgresql.conf and the sample's
// parameters, and every setting status.tuning reports; the exporter
// sidecar reads the server; a deleted Service comes back; a killed
// server is reported (WorkloadsUnavailable, naming the StatefulSet) and
// is back by itself with its data.
func TestPostgresSampleOnRealPods(t *testing.T) {
	ctx := context.Background()
	repo, exporter := postgresImages(t)
	startOperator(t)
	ns := cluster.Namespace(t)
	cs, dyn := clients(t)
	u := sample(t, "postgres.yaml")
	name := u.GetName()
	spec := u.Object["spec"].(map[string]any)
	spec["metrics"] = true
	spec["values"] = map[string]any{
		"image":   map[string]any{"repository": repo},
		"metrics": map[string]any{"image": map[string]any{"repository": exporter, "tag": "bookworm"}},
	}
	start := time.Now()
	if _, err := dyn.Resource(postgresGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := waitReady(t, dyn, postgresGVR, ns, name, "True", 6*time.Minute)
	t.Logf("%s Ready %s after create", name, time.Since(start).Round(time.Second))
	pod := onlyPod(t, cs, ns, name)
	secret, err := cs.CoreV1().Secrets(ns).Get(ctx, name+"-auth", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	user, password := string(secret.Data["username"]), string(secret.Data["password"])
	serviceIP := func() string {
		t.Helper()
		svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return svc.Spec.ClusterIP
	}
	// query runs sql through the Service, waiting a minute at most for
	// kube-proxy to follow the Service's endpoints.
	query := func(host, sql string) string {
		t.Helper()
		var out string
		var last error
		err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
			out, last = psql(t, host, user, password, sql)
			return last == nil, nil
		})
		if err != nil {
			t.Fatalf("%s through %s: %v", sql, host, last)
		}
		return out
	}
	host := serviceIP()
	if v := query(host, "show server_version_num"); !strings.HasPrefix(v, "17") {
		t.Errorf("server_version_num %s, want PostgreSQL 17 (spec.version)", v)
	}
	// The chart's rendered configuration and the sample's parameters.
	for setting, want := range map[string]string{
		"config_file":                "/etc/postgresql/postgresql.conf",
		"hba_file":                   "/etc/postgresql/pg_hba.conf",
		"max_wal_senders":            "5", // replicas + 4, in the chart's file
		"log_min_duration_statement": "500ms",
	} {
		if v := query(host, "show "+setting); v != want {
			t.Errorf("SHOW %s = %q, want %q", setting, v, want)
		}
	}
	tuning, _, _ := unstructured.NestedStringMap(got.Object, "status", "tuning")
	if tuning["shared_buffers"] == "" {
		t.Fatalf("status.tuning has no shared_buffers: %v", tuning)
	}
	for setting, want := range tuning {
		sql := "select current_setting('" + setting + "') = '" + want + "'"
		if strings.HasSuffix(want, "B") { // a size: compare bytes, as SHOW may pick another unit
			sql = "select pg_size_bytes(current_setting('" + setting + "')) = pg_size_bytes('" + want + "')"
		}
		if v := query(host, sql); v != "t" {
			t.Errorf("the server's %s = %s, status.tuning says %s", setting, query(host, "show "+setting), want)
		}
	}
	if m := get(t, "http://"+net.JoinHostPort(pod.Status.PodIP, "9187")+"/metrics"); !strings.Contains(m, "\npg_up 1") {
		t.Errorf("the exporter sidecar does not read the server (no pg_up 1)")
	}
	query(host, "create table kept (note text); insert into kept values ('written before the kill')")

	// Drift: a deleted Service is made again.
	old, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && svc.UID != old.UID, nil
	})
	if err != nil {
		t.Fatalf("the deleted Service %s was not made again", name)
	}
	host = serviceIP()
	if v := query(host, "select 1"); v != "1" {
		t.Errorf("select 1 through the new Service: %q", v)
	}

	// A killed server: reported, naming the workload, then back with its data.
	killReportedAndBack(t, postgresGVR, pod, "postgres")
	if v := query(host, "select note from kept"); v != "written before the kill" {
		t.Errorf("after the restart: %q", v)
	}
}
