// Package policy holds chartpilot's pure decisions about a resource: which
// chart version it gets (semver constraints, major opt-in, downgrades), the
// software major-version rule of typed kinds, maintenance windows, and the
// checks of the annotations that steer them. Nothing here reads the cluster;
// every rule is table-tested.
package policy
