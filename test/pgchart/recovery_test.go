package pgchart

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// TestRecoveryContainerRendered: with bootstrap.recovery, pod 0 gets an
// init container that runs the agent's recover --new-cluster before the
// instance manager, its store credentials by optional Secret reference
// only, the target as one word; without failover, or with a word the
// shell or the agent could read otherwise, the chart refuses to render.
func TestRecoveryContainerRendered(t *testing.T) {
	recovery := func(extra map[string]any) map[string]any {
		r := map[string]any{"enabled": true, "prefix": "shop/orders/pg15", "storeArgs": []any{"--store=s3", "--s3-bucket=backups"},
			"secretEnv":  []any{map[string]any{"name": "CHARTPILOT_S3_ACCESS_KEY_ID", "secretName": "s3", "key": "id"}},
			"targetTime": "2026-12-07T08:00:00.123456Z"}
		for k, v := range extra {
			r[k] = v
		}
		return r
	}
	rd := render(t, map[string]any{"replicas": 2, "failover": map[string]any{"enabled": true}, "bootstrap": map[string]any{"recovery": recovery(nil)}})
	inits := rd.sts.Spec.Template.Spec.InitContainers
	var names []string
	for _, c := range inits {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "install-instance-manager,recover" {
		t.Fatalf("init containers %v, want install-instance-manager then recover", names)
	}
	rc := inits[1]
	cmd := strings.Join(rc.Command, " ")
	for _, want := range []string{"exec \"$@\"", "/chartpilot/bin/chartpilot recover --new-cluster=db-primary --data-dir=/var/lib/postgresql/data/pgdata",
		"--manifest-file=/dev/termination-log", "--prefix=shop/orders/pg15", "--store=s3 --s3-bucket=backups", "--target-time=2026-12-07T08:00:00.123456Z"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("recover's command %q lacks %q", cmd, want)
		}
	}
	found := false
	for _, e := range rc.Env {
		if e.Name == "CHARTPILOT_S3_ACCESS_KEY_ID" {
			found = true
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Optional == nil || !*e.ValueFrom.SecretKeyRef.Optional {
				t.Errorf("the store's credential is %+v, want an optional Secret reference", e)
			}
		}
	}
	if !found {
		t.Error("recover has no store credential")
	}
	for _, c := range rd.sts.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == "CHARTPILOT_S3_ACCESS_KEY_ID" {
				t.Errorf("container %s has the recovery's store credential", c.Name)
			}
		}
	}

	ch, err := helm.LoadChart(filepath.Join("..", "..", "charts", "postgresql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"bootstrap": map[string]any{"recovery": recovery(nil)}}, "bootstrap.recovery needs failover.enabled"},
		{map[string]any{"failover": map[string]any{"enabled": true}, "bootstrap": map[string]any{"recovery": recovery(map[string]any{"storeArgs": []any{"--s3-prefix=a b"}})}}, "storeArgs"},
		{map[string]any{"failover": map[string]any{"enabled": true}, "bootstrap": map[string]any{"recovery": recovery(map[string]any{"targetTime": "yesterday; rm -rf /"})}}, "targetTime"},
		{map[string]any{"failover": map[string]any{"enabled": true}, "bootstrap": map[string]any{"recovery": recovery(map[string]any{"prefix": ""})}}, "bootstrap.recovery.prefix"},
	} {
		if _, err := helm.Template(ch, "db", "default", c.vals, ""); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("values %v: %v, want an error naming %q", c.vals["bootstrap"], err, c.want)
		}
	}
}
