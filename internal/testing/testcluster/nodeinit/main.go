// Command nodeinit is the init of a real node of the local cluster (see
// package nodebox): testcluster builds it and starts one per node.
package main

import "github.com/chartpilot/chartpilot/internal/testing/testcluster/nodebox"

func main() { nodebox.Main() }
