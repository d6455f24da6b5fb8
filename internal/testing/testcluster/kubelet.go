package testcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// KubeletStats serves the kubelet's /stats/summary for each node of the
// full tier, reached the way every client reaches a kubelet's statistics:
// through the API server's node proxy (/api/v1/nodes/NODE/proxy/stats/summary).
// kwok's nodes have no kubelet, so each node's address and kubelet port are
// pointed at a TLS server of this process, one port per node, which answers
// with the volume statistics a test sets for the pods on that node.
//
// The API server refuses to proxy to loopback addresses, so the servers
// listen on an address of 198.18.0.0/15 the cluster puts on the loopback
// interface (statsAddress).
type KubeletStats struct {
	cs      kubernetes.Interface
	servers []*httptest.Server
	mu      sync.Mutex
	// pods holds, per node, the statistics of its pods.
	pods map[string]map[types.NamespacedName]*statsv1alpha1.PodStats
}

// ServeKubeletStats starts the kubelet statistics of every node (full tier).
// Stop ends them.
func (c *Cluster) ServeKubeletStats(ctx context.Context) (*KubeletStats, error) {
	ip, err := c.statsAddress()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	k := &KubeletStats{cs: cs, pods: map[string]map[types.NamespacedName]*statsv1alpha1.PodStats{}}
	for _, n := range nodes.Items {
		name := n.Name
		ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		if err != nil {
			k.Stop()
			return nil, fmt.Errorf("listening for node %s's kubelet statistics: %w", name, err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { k.serve(name, w, r) }))
		srv.Listener.Close()
		srv.Listener = ln
		srv.StartTLS()
		k.servers = append(k.servers, srv)
		port := ln.Addr().(*net.TCPAddr).Port
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{
			"addresses":       []map[string]any{{"type": "InternalIP", "address": ip.String()}},
			"daemonEndpoints": map[string]any{"kubeletEndpoint": map[string]any{"Port": port}},
		}})
		if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			k.Stop()
			return nil, fmt.Errorf("pointing node %s at its kubelet statistics: %w", name, err)
		}
	}
	return k, nil
}

// statsAddress is this cluster's address for the kubelet statistics: the
// API server proxies to no loopback address, and tests send traffic to no
// address outside 198.18.0.0/15, so each cluster takes one of
// 198.18.255.1-250 (a lock file per address) and puts it on the loopback
// interface until Stop (or the watchdog, if this process dies).
func (c *Cluster) statsAddress() (net.IP, error) {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	if c.statsIP != nil {
		return c.statsIP, nil
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("kubelet statistics are served at an address of 198.18.0.0/15 put on this machine's loopback interface: run as root")
	}
	if err := os.MkdirAll(filepath.Dir(realNodesLock), 0o755); err != nil {
		return nil, err
	}
	for n := 1; n <= 250; n++ {
		f, err := os.OpenFile(filepath.Join(filepath.Dir(realNodesLock), fmt.Sprintf("chartpilot-stats-%d.lock", n)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, err
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			_ = f.Close()
			continue
		}
		ip := fmt.Sprintf("198.18.255.%d", n)
		script := filepath.Join(c.Dir, "stats-address.sh")
		if err := os.WriteFile(script, []byte("#!/bin/sh\nip addr del "+ip+"/32 dev lo 2>/dev/null\nexit 0\n"), 0o755); err != nil {
			_ = f.Close()
			return nil, err
		}
		_ = exec.Command("/bin/sh", script).Run() // left by a run that died
		if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("ip addr add %s/32 dev lo: %v: %s", ip, err, out)
		}
		c.watchdog.cleanup(script)
		c.statsIP, c.statsLock, c.statsScript = net.ParseIP(ip), f, script
		return c.statsIP, nil
	}
	return nil, errors.New("all of 198.18.255.1-250 are taken by other clusters of this machine")
}

// releaseStatsAddress takes the statistics address off the loopback interface.
func (c *Cluster) releaseStatsAddress() {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	if c.statsScript != "" {
		_ = exec.Command("/bin/sh", c.statsScript).Run()
		_ = c.statsLock.Close()
		c.statsIP, c.statsScript = nil, ""
	}
}

func (k *KubeletStats) serve(node string, w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/stats/summary" {
		http.NotFound(w, r)
		return
	}
	k.mu.Lock()
	sum := statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: node, StartTime: metav1.NewTime(time.Now())}}
	for _, p := range k.pods[node] {
		sum.Pods = append(sum.Pods, *p)
	}
	b, err := json.Marshal(sum) // under the lock: the pods' statistics are shared
	k.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// SetVolume sets what the kubelet of the pod's node reports for a volume of
// the pod backed by claim: used and capacity bytes.
func (k *KubeletStats) SetVolume(ctx context.Context, namespace, pod, claim string, used, capacity uint64) error {
	p, err := k.cs.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if p.Spec.NodeName == "" {
		return fmt.Errorf("pod %s/%s is not scheduled", namespace, pod)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	key := types.NamespacedName{Namespace: namespace, Name: pod}
	for _, pods := range k.pods {
		delete(pods, key) // the pod may have moved
	}
	if k.pods[p.Spec.NodeName] == nil {
		k.pods[p.Spec.NodeName] = map[types.NamespacedName]*statsv1alpha1.PodStats{}
	}
	ps := k.pods[p.Spec.NodeName][key]
	if ps == nil {
		ps = &statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: pod, Namespace: namespace, UID: string(p.UID)}, StartTime: p.CreationTimestamp}
	}
	now := metav1.NewTime(time.Now())
	avail := uint64(0)
	if capacity > used {
		avail = capacity - used
	}
	vs := statsv1alpha1.VolumeStats{
		Name:   "data",
		PVCRef: &statsv1alpha1.PVCReference{Name: claim, Namespace: namespace},
		FsStats: statsv1alpha1.FsStats{
			Time: now, UsedBytes: &used, CapacityBytes: &capacity, AvailableBytes: &avail,
		},
	}
	replaced := false
	for i := range ps.VolumeStats {
		if ps.VolumeStats[i].PVCRef != nil && ps.VolumeStats[i].PVCRef.Name == claim {
			ps.VolumeStats[i], replaced = vs, true
		}
	}
	if !replaced {
		ps.VolumeStats = append(ps.VolumeStats, vs)
	}
	k.pods[p.Spec.NodeName][key] = ps
	return nil
}

// Stop stops the servers.
func (k *KubeletStats) Stop() {
	for _, s := range k.servers {
		s.Close()
	}
}
