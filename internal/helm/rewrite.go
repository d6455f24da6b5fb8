package helm

import (
	"fmt"
	"time"

	"helm.sh/helm/v3/pkg/release"
	helmtime "helm.sh/helm/v3/pkg/time"
)

// Rewrite stores a deployed revision again as the next revision, with
// manifest in place of its manifest and description as its description,
// labels and everything else kept, and marks the revision superseded. It
// is how a release whose stored manifest names API versions the cluster
// no longer serves is made upgradable, rollable back and uninstallable
// again: Helm builds the objects of the stored manifest before each of
// those actions. The new record is created first: a crash between the two
// writes leaves two deployed revisions, the newer of which Helm acts on.
func (c *Client) Rewrite(namespace, name string, revision int, from, manifest, description string) (*Release, error) {
	cfg, err := c.actionConfig(Scope{Namespace: namespace})
	if err != nil {
		return nil, err
	}
	old, err := cfg.Releases.Get(name, revision)
	if err != nil {
		return nil, fmt.Errorf("reading release %s/%s revision %d: %w", namespace, name, revision, err)
	}
	if old.Info == nil || old.Info.Status != release.StatusDeployed {
		return nil, fmt.Errorf("release %s/%s revision %d is not deployed: only a deployed revision is rewritten", namespace, name, revision)
	}
	latest, err := cfg.Releases.Last(name)
	if err != nil {
		return nil, fmt.Errorf("reading release %s/%s: %w", namespace, name, err)
	}
	if old.Manifest != from {
		return nil, fmt.Errorf("release %s/%s revision %d changed since the rewrite was planned", namespace, name, revision)
	}
	if latest.Version != revision {
		return nil, fmt.Errorf("release %s/%s revision %d is not the newest (%d is)", namespace, name, revision, latest.Version)
	}
	next := *old
	info := *old.Info
	info.LastDeployed = helmtime.Time{Time: time.Now()}
	info.Description = description
	next.Info = &info
	next.Version = revision + 1
	next.Manifest = manifest
	if err := cfg.Releases.Create(&next); err != nil {
		return nil, fmt.Errorf("storing release %s/%s revision %d: %w", namespace, name, next.Version, err)
	}
	old.SetStatus(release.StatusSuperseded, old.Info.Description)
	if err := cfg.Releases.Update(old); err != nil {
		return nil, fmt.Errorf("marking release %s/%s revision %d superseded: %w", namespace, name, revision, err)
	}
	return fromHelm(&next), nil
}

// MarkSuperseded sets a deployed revision's status to superseded: how a
// rewrite cut between its two writes is finished.
func (c *Client) MarkSuperseded(namespace, name string, revision int) error {
	return c.setRevisionStatus(namespace, name, revision, release.StatusSuperseded, func(rel *release.Release) (string, error) {
		if rel.Info.Status != release.StatusDeployed {
			return "", nil
		}
		if rel.Info.Description == "" {
			return "Superseded", nil
		}
		return rel.Info.Description, nil
	})
}
