package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/chartpilot/chartpilot/internal/agent/instance"
)

// instanceCommand runs the instance manager of one PostgreSQL member (the
// container's entrypoint in each pod of charts/postgresql with failover).
func instanceCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("chartpilot instance", flag.ContinueOnError)
	var c instance.Config
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster)")
	passwordFile := fs.String("password-file", "", "file holding the superuser's password, set at initdb and used for replication and rewinds (default $POSTGRES_PASSWORD)")
	fs.StringVar(&c.Cluster, "cluster", "", "the cluster's name (its Leases: CLUSTER-primary and CLUSTER-MEMBER)")
	fs.StringVar(&c.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the cluster's namespace (default $POD_NAMESPACE)")
	fs.StringVar(&c.Member, "member", os.Getenv("POD_NAME"), "this member's name (default $POD_NAME)")
	fs.StringVar(&c.Pod, "pod", os.Getenv("POD_NAME"), "this member's pod, labelled chartpilot.dev/role=primary while it is primary (default $POD_NAME; empty: no label)")
	fs.StringVar(&c.Bin, "bin", "", "directory of the PostgreSQL binaries (postgres, initdb, pg_basebackup, pg_rewind, psql, pg_isready)")
	fs.StringVar(&c.DataDir, "data-dir", "/var/lib/postgresql/data/pgdata", "the data directory")
	fs.StringVar(&c.SocketDir, "socket-dir", "/var/run/postgresql", "the server's socket directory")
	fs.StringVar(&c.LogDir, "log-dir", "/tmp", "directory of the server's log")
	fs.StringVar(&c.ConfigFile, "config-file", "", "the server's postgresql.conf (default: the data directory's)")
	fs.StringVar(&c.HBAFile, "hba-file", "", "the server's pg_hba.conf, which must admit replication (default: the data directory's)")
	fs.StringVar(&c.Address, "address", "", "host:port where the other members reach this server (e.g. POD.HEADLESS-SERVICE:5432)")
	fs.StringVar(&c.ListenAddress, "listen-address", "*", "listen_addresses of the server")
	fs.IntVar(&c.Port, "port", 5432, "the server's port")
	fs.StringVar(&c.User, "user", "postgres", "the superuser (default $POSTGRES_USER, else postgres)")
	fs.StringVar(&c.ReplicationUser, "replication-user", "", "the role standbys clone, rewind and stream as, made by the primary with LOGIN REPLICATION and no superuser (empty: the superuser)")
	replicationPasswordFile := fs.String("replication-password-file", "", "file holding --replication-user's password (default $REPLICATION_PASSWORD; empty: standbys use the superuser)")
	fs.StringVar(&c.TLSCAFile, "tls-ca-file", "", "CA file the other members' certificates are verified against, with their names (sslmode=verify-full); empty: libpq's default (TLS when the server offers it, unverified)")
	fs.StringVar(&c.HostAuth, "host-auth", "scram-sha-256", "pg_hba method for connections from other hosts")
	fs.StringVar(&c.ReplicationNetwork, "replication-network", "0.0.0.0/0", "CIDR the other members connect from")
	fs.DurationVar(&c.LeaseDuration, "lease-duration", 10*time.Second, "how long the primary's Lease lasts unrenewed")
	fs.DurationVar(&c.RenewDeadline, "renew-deadline", 6*time.Second, "how long the primary tries to renew before it stops its server (less than --lease-duration)")
	fs.DurationVar(&c.Period, "period", time.Second, "period of the manager's loop")
	fs.IntVar(&c.Synchronous, "synchronous", 0, "synchronous standbys (0 or 1): with 1, a commit is acknowledged once a standby has it, and a failover loses no acknowledged commit")
	fs.Int64Var(&c.MaxLagBytes, "max-lag-bytes", 0, "a standby further behind the last primary than this does not promote (0: no limit)")
	health := fs.String("health-address", "", "serve the kubelet's probes here (GET /readyz, /livez: the server accepts connections on --port); empty: none")
	opts := zap.Options{}
	opts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The server runs as this process's user (in the chart, both are the
	// image's postgres user) and may be made to read files, /proc's
	// included (pg_read_server_files, pg_read_binary_file): this
	// process's environment (the superuser's password) and memory must
	// not be among them. Its children are dumpable again after exec.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the manager's environment and memory unreadable to the server: %w", err)
	}
	log := zap.New(zap.UseFlagOptions(&opts)).WithName("instance")
	c.Log = log
	if *passwordFile != "" {
		b, err := os.ReadFile(*passwordFile)
		if err != nil {
			return fmt.Errorf("--password-file: %w", err)
		}
		c.Password = strings.TrimSpace(string(b))
	} else {
		c.Password = os.Getenv("POSTGRES_PASSWORD")
	}
	if *replicationPasswordFile != "" {
		b, err := os.ReadFile(*replicationPasswordFile)
		if err != nil {
			return fmt.Errorf("--replication-password-file: %w", err)
		}
		c.ReplicationPassword = strings.TrimSpace(string(b))
	} else {
		c.ReplicationPassword = os.Getenv("REPLICATION_PASSWORD")
	}
	if c.ReplicationUser != "" && c.ReplicationPassword == "" {
		log.Info("No password for the replication role (the Secret has no replication-password key): standbys replicate as the superuser", "role", c.ReplicationUser)
	}
	if u := os.Getenv("POSTGRES_USER"); u != "" && !userSet(fs) {
		c.User = u
	}
	if err := c.Check(); err != nil {
		return err
	}
	var cfg *rest.Config
	var err error
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("reaching the API server: %w (give --kubeconfig outside a pod)", err)
	}
	cfg.Timeout = c.RenewDeadline / 3
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	m, err := instance.New(c)
	if err != nil {
		return err
	}
	ctrl.SetLogger(log)
	if *health != "" {
		if err := serveHealth(ctx, *health, c.Bin, c.Port); err != nil {
			return err
		}
	}
	return m.Run(ctx)
}

// serveHealth answers the kubelet's probes over HTTP, so that no probe
// runs a command in the server's container: such a command would carry
// the container's environment (the passwords) where the server can read
// it. Both paths say whether the server accepts connections (pg_isready
// on 127.0.0.1:port, run with no environment but PATH).
func serveHealth(ctx context.Context, addr, bin string, port int) error {
	ready := func(w http.ResponseWriter, r *http.Request) {
		cctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, filepath.Join(bin, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-t", "3")
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		if out, err := cmd.CombinedOutput(); err != nil {
			http.Error(w, strings.TrimSpace(string(out)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", ready)
	mux.HandleFunc("GET /livez", ready)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--health-address: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() { _ = srv.Serve(l) }()
	return nil
}

// userSet reports whether --user was given.
func userSet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "user" })
	return set
}
