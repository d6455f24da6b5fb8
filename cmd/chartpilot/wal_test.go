package main

import (
	"testing"

	"github.com/chartpilot/chartpilot/internal/agent/wal"
	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/backup"
)

// The command lines' defaults (agentargs, which the manager imports
// without the data path) are the data path's own.
func TestAgentDefaultsAgree(t *testing.T) {
	if agentargs.DefaultWALSegmentSize != wal.DefaultSegmentSize {
		t.Errorf("agentargs.DefaultWALSegmentSize %d, wal.DefaultSegmentSize %d", agentargs.DefaultWALSegmentSize, wal.DefaultSegmentSize)
	}
	if agentargs.CompressionZstd != backup.CompressionZstd {
		t.Errorf("agentargs.CompressionZstd %q, backup.CompressionZstd %q", agentargs.CompressionZstd, backup.CompressionZstd)
	}
}
