package instance_test

import (
	"testing"
	"time"

	"github.com/chartpilot/chartpilot/internal/agent/instance/instancetest"
)

// TestReplicationRoleDuringRollingUpgrade: a standby configured with a
// replication role, under a primary that has none (a primary of an older
// manager, during a rolling upgrade), clones and streams as the superuser;
// once the primary has the role, the standby streams as it (it asks again
// every 30 s), without a restart.
func TestReplicationRoleDuringRollingUpgrade(t *testing.T) {
	cluster.Skip(t)
	c := instancetest.New(t, instancetest.Options{
		API: cluster, Namespace: cluster.Namespace(t), Members: []string{"pg-0", "pg-1"},
		Replication: map[string]string{"pg-1": "replicator"}, Later: []string{"pg-1"},
		Command: memberCommand,
	})
	c.WaitSettled("pg-0")
	c.Start("pg-1")
	c.WaitSettled("pg-0", "pg-1")
	streamsAs := func(want string) {
		t.Helper()
		c.WaitFor("pg-1 streaming as "+want, 2*time.Minute, func() (bool, string) {
			out, _ := c.Psql(c.Ports["pg-0"], 5*time.Second, "SELECT application_name || '=' || usename FROM pg_stat_replication")
			return out == "pg-1="+want, out
		})
	}
	streamsAs("postgres")
	if out, _ := c.Psql(c.Ports["pg-0"], 5*time.Second, "SELECT count(*) FROM pg_roles WHERE rolname = 'replicator'"); out != "0" {
		t.Fatalf("a primary with no replication role configured made one (%s)", out)
	}
	// As a primary of this manager makes it (the members trust loopback
	// here: no password needed).
	if _, ok := c.Psql(c.Ports["pg-0"], 5*time.Second, "CREATE ROLE replicator LOGIN REPLICATION"); !ok {
		t.Fatal("creating the role failed")
	}
	streamsAs("replicator")
}
