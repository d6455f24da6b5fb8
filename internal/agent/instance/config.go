package instance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
)

// MovedMarker is the file, beside a data directory, that says its data was
// moved there from the cluster's primary with writes stopped (a major
// upgrade): with no live primary, the member that has it leads, whichever
// member the Lease names, and it is never rewound onto another's timeline.
func MovedMarker(dataDir string) string { return filepath.Clean(dataDir) + ".moved" }

// Config is one member of a cluster.
type Config struct {
	// Cluster names the cluster (its Leases: CLUSTER-primary, CLUSTER-MEMBER).
	Cluster, Namespace, Member string
	Client                     kubernetes.Interface
	// Pod, when set, is the member's pod: it carries v1alpha1.LabelMemberRole=primary while
	// the member is primary, so that the read-write Service follows it.
	Pod string
	// Bin holds the PostgreSQL binaries; DataDir the data directory;
	// SocketDir the server's socket; LogDir the server's log.
	Bin, DataDir, SocketDir, LogDir string
	// ConfigFile and HBAFile, when set, are the server's postgresql.conf
	// and pg_hba.conf (a chart's ConfigMap); the manager's own settings
	// are given on the command line over them. Empty: the data
	// directory's, with the manager's settings included and its
	// replication line added.
	ConfigFile, HBAFile string
	// Address is where the other members and clients reach this server
	// (host:port); ListenAddress and Port what it listens on.
	Address, ListenAddress string
	Port                   int
	// User is the superuser, also used for replication; Password its
	// password (empty with trust); HostAuth the pg_hba method for other
	// hosts (scram-sha-256; trust only on a private test network);
	// ReplicationNetwork the CIDR members connect from.
	User, Password, HostAuth, ReplicationNetwork string
	// ReplicationUser, when set, is the role standbys clone, rewind and
	// stream as (made by the primary: LOGIN REPLICATION, no superuser),
	// with ReplicationPassword (empty: standbys use the superuser).
	ReplicationUser, ReplicationPassword string
	// TLSCAFile, when set, is the CA members' certificates are checked
	// against (sslmode=verify-full for clones, rewinds and streaming).
	TLSCAFile string
	// Credential runs the server as another user (nil: this process's).
	Credential *syscall.Credential
	// LeaseDuration is how long a primary's Lease lasts unrenewed;
	// RenewDeadline how long a primary tries to renew before it fences
	// itself (less than LeaseDuration); Period the loop's period.
	LeaseDuration, RenewDeadline, Period time.Duration
	// Synchronous is the number of synchronous standbys (0 or 1).
	Synchronous int
	// MaxLagBytes: a standby further behind the last primary's position
	// than this does not promote (0: no limit).
	MaxLagBytes int64
	Log         logr.Logger
	// Now is the clock (tests).
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 10 * time.Second
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = c.LeaseDuration * 2 / 3
	}
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.User == "" {
		c.User = "postgres"
	}
	if c.HostAuth == "" {
		c.HostAuth = "scram-sha-256"
	}
	if c.ReplicationNetwork == "" {
		c.ReplicationNetwork = "0.0.0.0/0"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Check reports the first configuration error, naming the flag.
func (c *Config) Check() error {
	switch {
	case c.Cluster == "" || c.Namespace == "" || c.Member == "":
		return errors.New("--cluster, --namespace and --member are required")
	case c.Address == "":
		return errors.New("--address (host:port the other members reach this server at) is required")
	case checkAddress(c.Address) != nil:
		return fmt.Errorf("--address: %w", checkAddress(c.Address))
	case c.DataDir == "" || c.Bin == "":
		return errors.New("--data-dir and --bin are required")
	case c.RenewDeadline >= c.LeaseDuration:
		return fmt.Errorf("--renew-deadline %s must be shorter than --lease-duration %s: a primary must stop before its lease can pass to another", c.RenewDeadline, c.LeaseDuration)
	case c.Synchronous < 0 || c.Synchronous > 1:
		return fmt.Errorf("--synchronous %d: 0 or 1", c.Synchronous)
	}
	if c.TLSCAFile != "" {
		if strings.ContainsAny(c.TLSCAFile, " \t\n'\"\\") {
			return fmt.Errorf("--tls-ca-file %q: a path without spaces, quotes or backslashes (it goes into connection strings)", c.TLSCAFile)
		}
		if _, err := os.Stat(c.TLSCAFile); err != nil {
			return fmt.Errorf("--tls-ca-file: %w (the CA that signed the members' certificates; the chart mounts it from the Secret NAME-tls)", err)
		}
	}
	return c.checkReplication()
}
