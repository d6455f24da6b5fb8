package nodes

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// checkLinks checks how the Postgres name is reached: every standby
// streams as the replication role over TLS; a client without TLS is
// refused; the server's certificate is the one the chart's CA signed.
func checkLinks(t *testing.T, cs kubernetes.Interface, ns, name, host, user, password string, standbys int) {
	t.Helper()
	want := strings.TrimSuffix(strings.Repeat("replicator/true,", standbys), ",")
	var last string
	if err := wait.PollUntilContextTimeout(context.Background(), time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		out, err := psql(t, host, user, password, "SELECT string_agg(r.usename || '/' || s.ssl, ',') FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)")
		last = out
		if err != nil {
			last = err.Error()
		}
		return out == want, nil
	}); err != nil {
		t.Errorf("the standbys' connections (role/TLS): %q, want %q", last, want)
	}
	secret, err := cs.CoreV1().Secrets(ns).Get(context.Background(), name+"-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, secret.Data["ca.crt"], 0o600); err != nil {
		t.Fatal(err)
	}
	connect := func(env ...string) (string, error) {
		cmd := exec.Command(filepath.Join(testpg.Bin(t), "psql"), "-h", host, "-p", "5432", "-U", user, "-d", "postgres", "-XAtq", "-c", "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
		cmd.Env = append([]string{"PGPASSWORD=" + password, "PGCONNECT_TIMEOUT=10"}, env...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := connect("PGSSLMODE=disable"); err == nil || !strings.Contains(out, "no encryption") {
		t.Errorf("a connection without TLS: %v %q, want refused (no pg_hba.conf entry, no encryption)", err, out)
	}
	if out, err := connect("PGSSLMODE=verify-ca", "PGSSLROOTCERT="+ca); err != nil || out != "t" {
		t.Errorf("a connection verifying the server against the Secret's ca.crt: %v %q", err, out)
	}
}
