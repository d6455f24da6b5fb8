//go:build tools

// Package tools pins the kubelet and kube-proxy of the local cluster's real
// nodes, from the same Kubernetes release as its control plane.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
