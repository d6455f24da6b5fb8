//go:build tools

// Package tools pins CoreDNS, the cluster DNS (cluster.local) of the local
// cluster's real nodes.
package tools

import (
	_ "github.com/coredns/coredns"
)
