//go:build tools

// Package tools pins the control plane of Kubernetes 1.35 (kube-apiserver,
// kube-controller-manager, kube-scheduler) that the e2e tests also run against.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
