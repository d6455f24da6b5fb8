//go:build tools

// Package tools pins runc, the OCI runtime containerd starts containers with
// on the local cluster's real nodes (built with cgo and seccomp).
package tools

import (
	_ "github.com/opencontainers/runc"
)
