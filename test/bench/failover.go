package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/chartpilot/chartpilot/internal/agent/instance/instancetest"
	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

func (b *benchT) Logf(format string, a ...any) { logf(format, a...) }
func (b *benchT) Failed() bool                 { return false }

// runFailoverBench runs a three-member cluster of `bin/chartpilot instance`
// processes with one synchronous standby on the API tier, and kills the
// primary (manager and server, SIGKILL) runs times under a steady write
// load, the old primary rejoining between runs.
func runFailoverBench(root string, runs int) ([]instancetest.Result, error) {
	t := &benchT{}
	defer t.done()
	c, err := testcluster.Start(context.Background(), testcluster.Options{Tier: testcluster.TierAPI, BinDir: filepath.Join(root, "bin")})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Stop() }()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	ns := "failover-bench"
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	chartpilot := filepath.Join(root, "bin", "chartpilot")
	pc := instancetest.New(t, instancetest.Options{
		API: c, Namespace: ns, Synchronous: 1, Members: []string{"pg-0", "pg-1", "pg-2"},
		Command: func(s instancetest.MemberSpec) *exec.Cmd {
			path := s.WriteKubeconfig(t)
			cfg := s.Config()
			cmd := exec.Command(chartpilot, "instance", "--kubeconfig", path,
				"--cluster", s.Cluster, "--namespace", s.Namespace, "--member", s.Member, "--pod", s.Member,
				"--bin", s.Bin, "--data-dir", s.DataDir, "--socket-dir", s.SocketDir, "--log-dir", s.LogDir,
				"--address", cfg.Address, "--listen-address", cfg.ListenAddress, "--port", strconv.Itoa(s.Port),
				"--host-auth", cfg.HostAuth, "--replication-network", cfg.ReplicationNetwork,
				"--lease-duration", cfg.LeaseDuration.String(), "--renew-deadline", cfg.RenewDeadline.String(), "--period", cfg.Period.String(),
				"--synchronous", strconv.Itoa(s.Synchronous))
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C"}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cfg.Credential, Pdeathsig: syscall.SIGKILL}
			return cmd
		},
	})
	var out []instancetest.Result
	old, standbys := pc.WaitSettled("")
	pc.WaitSettled(old, standbys...)
	for i := range runs {
		r := pc.Failover(i*100000 + 1)
		logf("failover %d of %d: %s → %s in %s, %d rows acknowledged, %d lost", i+1, runs, r.From, r.To, r.Took.Round(time.Millisecond), r.Acked, r.Lost)
		out = append(out, r)
		pc.Rejoin(r.From, r.To)
	}
	return out, nil
}

func printFailover(rs []instancetest.Result) {
	if len(rs) == 0 {
		return
	}
	fmt.Printf("\nFailover — three `chartpilot instance` members (PostgreSQL from Debian), one synchronous standby, Lease 4 s (renew deadline 2.5 s); the primary's manager and server SIGKILLed under a steady insert load through the read-write endpoint\n\n")
	fmt.Println("| run | from → to | kill to first write on the new primary (s) | rows acknowledged | acknowledged rows lost | writes on the old primary after the new one's first |")
	fmt.Println("|---:|---|---:|---:|---:|---:|")
	var took []time.Duration
	for i, r := range rs {
		fmt.Printf("| %d | %s → %s | %.2f | %d | %d | %d |\n", i+1, r.From, r.To, r.Took.Seconds(), r.Acked, r.Lost, len(r.LateOldAcks))
		took = append(took, r.Took)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	fmt.Printf("\nMedian of %d: %.2f s (the Lease's 4 s, its expiry seen within a 250 ms period, promotion, the label switch, the client's reconnection).\n", len(took), took[len(took)/2].Seconds())
}
