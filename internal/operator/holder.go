package operator

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/chartpilot/chartpilot/internal/release"
)

// replicaIdentity names this process: its leader election identity and the
// holder written on every revision it starts. It fits a label value.
func replicaIdentity() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, host)
	if len(host) > 48 {
		host = host[:48]
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return strings.Trim(host, "-.") + "_" + hex.EncodeToString(b)
}

// holderAndLock returns this process's Holder and, with leader election, the
// Lease lock it elects with under the same identity (so that a pending
// revision's holder can be checked against the Lease).
func holderAndLock(o Options) (release.Holder, resourcelock.Interface, error) {
	h := release.Holder{Identity: replicaIdentity(), LeaseDuration: o.LeaseDuration}
	if !o.LeaderElection {
		return h, nil, nil
	}
	ns := o.LeaderElectionNamespace
	if ns == "" {
		b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			return h, nil, fmt.Errorf("leader election outside a cluster needs a namespace for its Lease: %w", err)
		}
		ns = strings.TrimSpace(string(b))
	}
	cs, err := kubernetes.NewForConfig(o.Config)
	if err != nil {
		return h, nil, err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, o.LeaderElectionID, cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: h.Identity})
	if err != nil {
		return h, nil, fmt.Errorf("leader election lock: %w", err)
	}
	h.LeaseNamespace, h.LeaseName = ns, o.LeaderElectionID
	return h, lock, nil
}
