package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

var cluster *testcluster.Cluster

// probes are what a test binary run again as a child does instead of
// its tests, chosen by $CHARTPILOT_TEST_PROBE (see sandbox_test.go).
var probes = map[string]func() int{}

func TestMain(m *testing.M) {
	if p := probes[os.Getenv("CHARTPILOT_TEST_PROBE")]; p != nil {
		os.Exit(p())
	}
	os.Exit(testcluster.RunMain(m, testcluster.Options{Tier: testcluster.TierAPI}, &cluster))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func watchesFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "watches.yaml")
	if err := os.WriteFile(f, []byte("[]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestRunServesHealthAndMetricsUntilCancelled(t *testing.T) {
	cluster.Skip(t)
	probes, metrics := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{
			"--kubeconfig", cluster.KubeconfigPath,
			"--watches", watchesFile(t),
			"--health-probe-bind-address", probes,
			"--metrics-bind-address", metrics,
		})
	}()
	get := func(url string) (int, string) { return httpGet(http.DefaultClient, url, "") }
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("run returned early: %w", err)
		default:
		}
		code, body := get("http://" + probes + "/readyz")
		last = fmt.Sprintf("%d %s", code, body)
		return code == http.StatusOK, nil
	})
	if err != nil {
		cancel()
		t.Fatalf("waiting for /readyz: %v (last: %s)", err, last)
	}
	if code, body := get("http://" + probes + "/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get("http://" + metrics + "/metrics"); code != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
		t.Errorf("/metrics = %d, controller-runtime series missing", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("run did not stop within a minute of cancellation")
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad-kubeconfig")
	if err := os.WriteFile(bad, []byte("clusters: [oops"), 0o600); err != nil {
		t.Fatal(err)
	}
	unreachable := filepath.Join(dir, "unreachable")
	if err := os.WriteFile(unreachable, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	w := watchesFile(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	good := ""
	if cluster != nil {
		good = cluster.KubeconfigPath
	}
	for name, tc := range map[string]struct {
		args    []string
		want    []string
		cluster bool
	}{
		"kubeconfig does not parse": {args: []string{"--kubeconfig", bad, "--watches", w}, want: []string{"does not parse", "--kubeconfig"}},
		"kubeconfig missing":        {args: []string{"--kubeconfig", filepath.Join(dir, "none"), "--watches", w}, want: []string{"cannot be read", "--kubeconfig"}},
		"api server unreachable":    {args: []string{"--kubeconfig", unreachable, "--watches", w}, want: []string{"cannot reach the API server at https://127.0.0.1:1", "--kubeconfig"}},
		"watches missing":           {args: []string{"--kubeconfig", bad, "--watches", filepath.Join(dir, "w.yaml")}, want: []string{"--watches", "does not exist"}},
		"unknown flag":              {args: []string{"--kubeconfg", bad}, want: []string{"kubeconfg"}},
		"chart size limit too low":  {args: []string{"--max-chart-size", "1000"}, want: []string{"--max-chart-size", "at least 65536"}},
		"index size limit too low":  {args: []string{"--max-index-size", "0"}, want: []string{"--max-index-size", "at least 65536"}},
		"gc percent too low":        {args: []string{"--gc-percent", "5"}, want: []string{"--gc-percent 5", "at least 10"}},
		"probe port busy":           {args: []string{"--kubeconfig", good, "--watches", w, "--health-probe-bind-address", busy.Addr().String(), "--metrics-bind-address", "0"}, want: []string{"already in use", "--health-probe-bind-address"}, cluster: true},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.cluster {
				cluster.Skip(t)
			}
			err := run(context.Background(), tc.args)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// With --metrics-secure, /metrics answers only callers the API server
// authenticates and authorizes for get on /metrics.
func TestSecureMetricsNeedAnAuthorizedCaller(t *testing.T) {
	cluster.Skip(t)
	reader, err := cluster.ServiceAccountConfig("metrics-test", "reader", []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := cluster.ServiceAccountConfig("metrics-test", "other", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}})
	if err != nil {
		t.Fatal(err)
	}
	probes, metrics := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--kubeconfig", cluster.KubeconfigPath, "--watches", watchesFile(t),
			"--health-probe-bind-address", probes, "--metrics-bind-address", metrics, "--metrics-secure"})
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("run did not stop within a minute of cancellation")
		}
	}()
	httpc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	get := func(token string) (int, string) { return httpGet(httpc, "https://"+metrics+"/metrics", token) }
	var code int
	var body string
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("run returned early: %w", err)
		default:
		}
		code, body = get(reader.BearerToken)
		return code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("authorized caller: %v (last: %d %.200s)", err, code, body)
	}
	if !strings.Contains(body, "controller_runtime_") {
		t.Errorf("authorized caller got no controller-runtime series")
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	// controller-runtime's filter answers 500 to a token its TokenReview
	// does not accept: what matters is that nothing is served.
	if code, body := get("not-a-token"); code == http.StatusOK || strings.Contains(body, "controller_runtime_") {
		t.Errorf("a token the API server does not know: %d, metrics served", code)
	}
	if code, _ := get(other.BearerToken); code != http.StatusForbidden {
		t.Errorf("a caller without get on /metrics: %d, want 403", code)
	}
	if resp, err := http.Get("http://" + metrics + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "controller_runtime_") {
			t.Error("metrics were served over plain HTTP")
		}
	}
}

// httpGet returns the status code and body of a GET of url (with a bearer
// token when one is given); a request that fails is code 0 and its error.
func httpGet(c *http.Client, url, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
