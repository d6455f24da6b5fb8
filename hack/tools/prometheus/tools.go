//go:build tools

// Package tools pins promtool, which checks and unit-tests the alert rules,
// and the Prometheus server that the real-node tests run against the
// shipped ServiceMonitors and rules.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
