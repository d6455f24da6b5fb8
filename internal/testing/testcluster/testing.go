package testcluster

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// RunMain starts one cluster for a test package, runs its tests and stops the
// cluster. A failed start prints the error (which names the component logs)
// and fails the package. On test failure the working directory is kept and
// its path printed, so the component logs can be read.
//
//	func TestMain(m *testing.M) { os.Exit(testcluster.RunMain(m, testcluster.Options{}, &cluster)) }
func RunMain(m *testing.M, opts Options, out **Cluster) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testcluster: %v\n", err)
		return 1
	}
	*out = c
	code := m.Run()
	if code != 0 {
		c.KeepDir()
		fmt.Fprintf(os.Stderr, "testcluster: tests failed; component logs kept in %s\n", c.LogDir)
	}
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testcluster: stopping: %v\n", err)
	}
	return code
}

// Skip skips the test when no cluster runs (go test -short).
func (c *Cluster) Skip(t testing.TB) {
	t.Helper()
	if c == nil {
		t.Skip("needs the local cluster; not started with -short")
	}
}

// Namespace creates a namespace for one test, named after it, and deletes it
// when the test ends. Without a cluster (-short) it skips the test.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	c.Skip(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, name)
	if len(name) > 40 {
		name = name[:40]
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: strings.Trim(name, "-") + "-"}}
	created, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("namespace %s kept; component logs in %s", created.Name, c.LogDir)
			return
		}
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created.Name
}
