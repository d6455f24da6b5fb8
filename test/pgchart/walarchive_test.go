package pgchart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/agent/wal"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
	"github.com/chartpilot/chartpilot/internal/testing/testwait"
)

// TestChartArchivesWAL renders charts/postgresql with walArchive on and
// runs pod 0 as the kubelet would, with a real S3 server: the chart's own
// archive_command runs the agent (built into the directory the chart's
// install-agent init container fills), which asks the WAL service of the
// wal-agent container, run beside the server with the store's
// credentials and the archive's key from the Secrets walArchive.secretEnv
// names. A WAL file switched out reaches the store, pg_stat_archiver
// counts it with no failure, it is fetched back decrypted with the key;
// nothing the chart renders into files or command lines holds a
// credential, and none is in the server's environment or memory.
func TestChartArchivesWAL(t *testing.T) {
	if testing.Short() {
		t.Skip("a real PostgreSQL server and an S3 server")
	}
	r := testpg.NewRunner(t, testpg.Bin(t))
	s3 := backuptest.StartS3(t, t.TempDir())
	id, err := age.GenerateX25519Identity()
	must(t, err)
	secrets := map[string]map[string]string{
		"store-credentials": {"accessKeyID": s3.AccessKeyID, "secretAccessKey": s3.SecretAccessKey},
		"archive-key":       {"key": id.String()},
	}
	port := testpg.FreePort(t)
	rd := render(t, map[string]any{
		"image":    map[string]any{"binDir": testpg.Bin(t)},
		"replicas": 1,
		"service":  map[string]any{"port": port},
		"walArchive": map[string]any{
			"enabled": true, "prefix": "shop/orders", "timeout": "60s",
			"storeArgs": []any{"--store=s3", "--s3-endpoint=" + s3.Endpoint, "--s3-bucket=" + s3.Bucket, "--s3-prefix=" + s3.Prefix, "--s3-force-path-style"},
			"secretEnv": []any{
				map[string]any{"name": "CHARTPILOT_S3_ACCESS_KEY_ID", "secretName": "store-credentials", "key": "accessKeyID"},
				map[string]any{"name": "CHARTPILOT_S3_SECRET_ACCESS_KEY", "secretName": "store-credentials", "key": "secretAccessKey"},
				map[string]any{"name": "CHARTPILOT_AGE_KEY", "secretName": "archive-key", "key": "key"},
			},
		},
	})
	spec := rd.sts.Spec.Template.Spec
	main := spec.Containers[0]
	var installs bool
	for _, c := range spec.InitContainers {
		if c.Name == "install-agent" && strings.Join(c.Command, " ") == "/usr/local/bin/chartpilot install-agent /chartpilot/bin" {
			installs = true
		}
	}
	if !installs {
		t.Fatal("no init container copies the agent into /chartpilot/bin")
	}
	var agent *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "wal-agent" {
			agent = &spec.Containers[i]
		}
	}
	if agent == nil {
		t.Fatal("no wal-agent container")
	}
	conf := rd.config["postgresql.conf"]
	for _, want := range []string{"archive_mode = always", "archive_timeout = '60s'", "archive_command = '/chartpilot/bin/chartpilot wal-push --via=/var/run/postgresql/.chartpilot-wal %p'"} {
		if !strings.Contains(conf, want) {
			t.Errorf("postgresql.conf lacks %q:\n%s", want, conf)
		}
	}
	// No credential in what is rendered into files or command lines.
	rendered := conf + strings.Join(main.Command, " ") + strings.Join(main.Args, " ") + strings.Join(agent.Command, " ")
	for _, c := range spec.InitContainers {
		rendered += strings.Join(c.Command, " ")
	}
	for _, e := range append(main.Env, agent.Env...) {
		rendered += e.Value
	}
	for _, s := range []string{s3.SecretAccessKey, s3.AccessKeyID, id.String()} {
		if strings.Contains(rendered, s) {
			t.Fatal("a credential is in the rendered configuration or a command line")
		}
	}

	p := newPod(t, r, rd, r.TempDir(t), 0, port)
	for name := range p.env {
		if strings.HasPrefix(name, "CHARTPILOT_") {
			t.Errorf("the postgresql container's environment has %s", name)
		}
	}
	// The Secrets' values, as the kubelet gives them to wal-agent, by the
	// references the chart rendered.
	agentEnv := map[string]string{}
	for _, e := range agent.Env {
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			if v, ok := secrets[ref.SecretKeyRef.Name][ref.SecretKeyRef.Key]; ok {
				agentEnv[e.Name] = v
			}
		}
	}
	if len(agentEnv) != 3 {
		t.Fatalf("%d of the 3 Secret references of walArchive.secretEnv are in the wal-agent container's environment", len(agentEnv))
	}
	// What install-agent copies (the agent, where the chart's mount is),
	// the same binary as the chartpilot image's.
	bin := p.mounts["/chartpilot/bin"]
	if bin == "" {
		t.Fatal("the postgresql container does not mount /chartpilot/bin")
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "chartpilot"), "../../cmd/chartpilot").CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}
	var words []string
	for _, w := range agent.Command {
		words = append(words, strings.Replace(p.apply(w), "/usr/local/bin/chartpilot", filepath.Join(bin, "chartpilot"), 1))
	}
	service := r.Command(agentEnv, words[0], words[1:]...)
	serviceLog, err := os.Create(filepath.Join(p.dir, "wal-agent.log"))
	must(t, err)
	service.Stdout, service.Stderr = serviceLog, serviceLog
	must(t, service.Start())
	t.Cleanup(func() {
		_ = service.Process.Kill()
		_ = service.Wait()
		serviceLog.Close()
		if t.Failed() {
			log, _ := os.ReadFile(serviceLog.Name())
			t.Logf("wal-agent:\n%s", log)
		}
	})
	p.runInit(rd)
	p.start(rd)
	p.waitProbe(main.StartupProbe, port)
	socket := filepath.Join(p.mounts["/var/run/postgresql"], ".chartpilot-wal")
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the WAL service's socket: %v, %v; want a socket of mode 0600", fi, err)
	}

	q := func(query string) string {
		t.Helper()
		out, err := psql(r, "127.0.0.1", port, rd.username, rd.password, query)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return out
	}
	q("CREATE TABLE orders (id int); INSERT INTO orders SELECT generate_series(1, 1000)")
	switched := q("SELECT pg_walfile_name(pg_switch_wal())")
	var last, seen string
	if !testwait.Until(2*time.Minute, 200*time.Millisecond, func() bool {
		out, err := psql(r, "127.0.0.1", port, rd.username, rd.password, "SELECT archived_count || ' ' || failed_count || ' ' || COALESCE(last_archived_wal, '-') FROM pg_stat_archiver")
		seen = out + " " + errString(err)
		f := strings.Fields(out)
		if err != nil || len(f) < 3 {
			return false
		}
		if f[1] != "0" {
			log, _ := os.ReadFile(p.logPath)
			t.Fatalf("archive_command failed %s times:\n%s", f[1], log)
		}
		last = f[2]
		return last != "-" && last >= switched
	}) {
		log, _ := os.ReadFile(p.logPath)
		t.Fatalf("%s not archived within 2 minutes; pg_stat_archiver: %s\n%s", switched, seen, log)
	}

	b, err := blobstore.OpenS3(context.Background(), s3)
	must(t, err)
	defer b.Close()
	a := &wal.Archive{Bucket: b, Prefix: "shop/orders", Identity: id.String()}
	w, err := a.Window(context.Background())
	must(t, err)
	if w.LastWAL < switched || w.Files < 1 {
		t.Fatalf("the store holds %d WAL files up to %q, want %s", w.Files, w.LastWAL, switched)
	}
	dest := filepath.Join(t.TempDir(), switched)
	if err := a.Fetch(context.Background(), switched, dest); err != nil {
		t.Fatalf("fetching %s back with the archive's key: %v", switched, err)
	}
	if fi, err := os.Stat(dest); err != nil || fi.Size() != wal.DefaultSegmentSize {
		t.Fatalf("the fetched %s: %v (%v bytes), want a whole segment", switched, err, fi)
	}
	// Without the key it cannot be read: the stored object is encrypted.
	plain := &wal.Archive{Bucket: b, Prefix: "shop/orders"}
	if err := plain.Fetch(context.Background(), switched, filepath.Join(t.TempDir(), switched)); err == nil {
		t.Error("a WAL file fetched without the archive's key: it was stored unencrypted")
	}
	// What a role allowed to read the server's files and memory finds:
	// none of the credentials.
	mem, err := testpg.ServerMemory(func(sql string) (string, error) {
		return psql(r, "127.0.0.1", port, rd.username, rd.password, sql)
	})
	must(t, err)
	if !bytes.Contains(mem, []byte("PGDATA=")) {
		t.Fatalf("PGDATA= not in the %d bytes read of the server's memory: the search finds nothing", len(mem))
	}
	for what, s := range map[string]string{"the store's secret key": s3.SecretAccessKey, "the archive's key": id.String()} {
		if bytes.Contains(mem, []byte(s)) {
			t.Errorf("%s is in the server's memory", what)
		}
	}
	t.Logf("archived up to %s (last archived %s), %d WAL files in the store", switched, last, w.Files)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
