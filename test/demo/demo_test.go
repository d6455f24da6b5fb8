// Package demo runs `make demo`'s script non-interactively and checks its
// key lines (the three stories: a typed Postgres; a fleet's chart bump with
// canaries, a halted rollout and a held major; tenants), so that the
// README's first command cannot rot.
package demo

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestDemoScript(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo starts a full local cluster")
	}
	root, err := testcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"chartpilot", "devcluster", "kubectl"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			t.Fatalf("bin/%s is missing: make test builds it (make build, make tools)", b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "demo.sh"))
	cmd.Env = append(os.Environ(), "DEMO_DIR="+t.TempDir(), "DEMO_KEEP=0",
		"DEMO_METRICS_PORT="+strconv.Itoa(freePort(t)), "DEMO_PROBE_PORT="+strconv.Itoa(freePort(t)))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/demo.sh: %v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{
		"ready kubeconfig=",
		"GET /healthz -> ok",
		"serviceaccount/chartpilot-deployer created in demo",
		"rolebinding/chartpilot-deployer created in fleet (ClusterRole chartpilot-deployer)",
		"postgres.chartpilot.dev/orders condition met",
		"redis.chartpilot.dev/sessions condition met",
		"tuning:    {",
		"shared_buffers",
		"never shrink",
		"DriftCorrected",
		"Webapp: 20 of 20 on chart version 1.0.0 and Ready",
		"Webapp: 20 of 20 on chart version 1.1.0 and Ready",
		"halted (a canary failed)",
		"the rollout of 1.2.0 halted (exit 1)",
		"2.0.0 available and held back",
		"team-a: Redis image redis:7.2",
		"team-b: Redis image redis:7.4",
		`denied the request: replicas 3 exceeds tenant team-a's limits.maxReplicas 1`,
		"==> demo done",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	// What a newcomer should not see: warnings of kubectl apply over objects
	// it did not create, or a frame of --watch printed again unchanged.
	for _, unwanted := range []string{"last-applied-configuration", "Warning:"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("the demo's output has %q", unwanted)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}
