// Package nodes runs what chartpilot deploys on real nodes: containers
// that run (containerd, runc, a kubelet, CNI), not simulated pods.
package nodes

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

var cluster *testcluster.Cluster

// Measurements make bench asks for (the defaults keep make test short).
var (
	failoverRuns = flag.Int("failover-runs", 1, "how often TestFailoverOnRealPods keeps the primary down past its Lease")
	dataMB       = flag.Int("data-mb", 0, "MiB of rows added to the databases TestBackupRestoreOnRealPods backs up and TestMajorUpgradeOnRealPods moves")
	reportPath   = flag.String("report", "", "append each measurement to this file as a line of JSON")
)

// report appends measurement kind with its fields to -report, when set.
func report(t *testing.T, kind string, fields map[string]any) {
	t.Helper()
	if *reportPath == "" {
		return
	}
	fields["kind"] = kind
	line, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(*reportPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
}

// fillMB adds a table of about mb MiB (rows of 1 KiB of hex digits, which
// compress to about half) to database db of Postgres name in ns, if mb > 0.
func fillMB(t *testing.T, ns, name, db string, mb int) {
	t.Helper()
	if mb <= 0 {
		return
	}
	const chunk = 16 * 1024 // rows: 16 MiB a statement
	for from := 0; from < mb*1024; from += chunk {
		sql := fmt.Sprintf("CREATE TABLE IF NOT EXISTS bulk (id bigint PRIMARY KEY, pad text); INSERT INTO bulk SELECT g, string_agg(md5((g * 32 + i)::text), '') FROM generate_series(%d, %d) g, generate_series(1, 32) i GROUP BY g",
			from+1, min(from+chunk, mb*1024))
		superQuery(t, ns, name, db, sql)
	}
	t.Logf("%s/%s: %s", name, db, superQuery(t, ns, name, db, "SELECT pg_size_pretty(pg_database_size(current_database()))"))
}

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard()) // the in-process operator's (startOperator)
	os.Exit(testcluster.RunMain(m, testcluster.Options{Tier: testcluster.TierFull, Nodes: 1, RealNodes: 1}, &cluster))
}

// onRealNode places a pod on the real node (its label and taint).
func onRealNode(spec *corev1.PodSpec) {
	spec.NodeSelector = map[string]string{testcluster.RealNodeLabel: "true"}
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: testcluster.RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
}

// servePod runs podutil's server in pod name on the real node, as UID 65532
// on a read-only root filesystem, and returns its IP once it is Ready.
func servePod(t *testing.T, cs kubernetes.Interface, ns, name string, labels map[string]string) string {
	t.Helper()
	ctx := context.Background()
	uid, yes, no := int64(65532), true, false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{
				Name: "web", Image: cluster.PodUtilImage, Args: []string{"serve", ":8080"},
				Ports:          []corev1.ContainerPort{{ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &yes, ReadOnlyRootFilesystem: &yes, AllowPrivilegeEscalation: &no,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	onRealNode(&pod.Spec)
	// ServiceAccount admission needs the namespace's default ServiceAccount,
	// which the controller manager makes a moment after the namespace.
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		last = fmt.Sprint(err)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("creating pod %s: %s", name, last)
	}
	var ip string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("phase %s, ip %q, conditions %v, statuses %v", p.Status.Phase, p.Status.PodIP, p.Status.Conditions, p.Status.ContainerStatuses)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ip = p.Status.PodIP
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s not Ready: %s: %v", name, last, err)
	}
	if !strings.HasPrefix(ip, "198.18.") {
		t.Fatalf("pod IP %s is outside 198.18.0.0/15", ip)
	}
	return ip
}

// get returns what url answers, trimmed.
func get(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(body))
}

// TestPodAnswersAtItsIP: a pod on the real node runs its container as UID
// 65532 with a read-only root filesystem, pulled from the cluster's
// registry, and answers HTTP at its pod IP with its own host name: only a
// running container can (a simulated pod has an IP nothing listens on).
func TestPodAnswersAtItsIP(t *testing.T) {
	ns := cluster.Namespace(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ip := servePod(t, cs, ns, "web", nil)
	if got := get(t, "http://"+ip+":8080/"); got != "hello from web" {
		t.Errorf("the pod at %s answered %q, want %q", ip, got, "hello from web")
	}
}

// TestServiceReachesItsPods: a Service's address (198.19.0.0/16, routed by
// kube-proxy) answers from this machine and, through exec, from inside
// another pod, also by its names (CoreDNS serving cluster.local).
func TestServiceReachesItsPods(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	servePod(t, cs, ns, "backend", map[string]string{"app": "backend"})
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "backend"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(svc.Spec.ClusterIP, "198.19.") {
		t.Fatalf("Service address %s is outside 198.19.0.0/16", svc.Spec.ClusterIP)
	}
	url := "http://" + svc.Spec.ClusterIP + "/"
	var got string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		c := &http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			got = err.Error()
			return false, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got = strings.TrimSpace(string(b))
		return got == "hello from backend", nil
	})
	if err != nil {
		t.Fatalf("the Service at %s from this machine: %s", url, got)
	}
	servePod(t, cs, ns, "client", nil)
	// By address, by the Service's full name and by its short name (the
	// cluster DNS and the pod's search path).
	for _, u := range []string{url, "http://backend." + ns + ".svc.cluster.local/", "http://backend/"} {
		out, err := cluster.Exec(ctx, ns, "client", "web", "/usr/local/bin/podutil", "get", u)
		if err != nil || strings.TrimSpace(out) != "hello from backend" {
			t.Errorf("%s from inside pod client: %q, %v", u, out, err)
		}
	}
}
