package agentargs

import (
	"flag"
	"io"
	"reflect"
	"testing"
	"time"
)

// TestArgsParseBack: what Args writes, Register parses back into the same
// Store, for every kind.
func TestArgsParseBack(t *testing.T) {
	for _, s := range []Store{
		{Kind: S3, S3Endpoint: "https://s3.example.test", S3Bucket: "backups", S3Prefix: "team-a", S3Region: "eu-1", S3ForcePathStyle: true, S3CAFile: "/etc/chartpilot/ca/ca.pem"},
		{Kind: S3, S3Bucket: "backups", S3Region: DefaultS3Region},
		{Kind: Azure, AzureEndpoint: "http://127.0.0.1:10000/acct", AzureAccount: "acct", AzureContainer: "c", AzurePrefix: "p"},
		{Kind: GCS, GCSEndpoint: "http://127.0.0.1:4443", GCSBucket: "b", GCSPrefix: "p"},
		{Kind: Volume, VolumePath: "/backups/team-a"},
	} {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var got Store
		got.Register(fs)
		if err := fs.Parse(s.Args()); err != nil {
			t.Fatalf("%q: %v", s.Args(), err)
		}
		want := s
		if want.Kind != S3 {
			want.S3Region = DefaultS3Region // the flag's default, unused
		}
		if got != want {
			t.Errorf("%q parsed back as %+v, want %+v", s.Args(), got, want)
		}
	}
}

// TestBackupArgsParseBack: the command lines the Jobs give, parsed by the
// agent's flags, are what they were built from.
func TestBackupArgsParseBack(t *testing.T) {
	store := Store{Kind: S3, S3Bucket: "backups", S3Region: "eu-1", S3CAFile: "/etc/chartpilot/ca/ca.pem"}
	for _, b := range []Backup{
		{Sub: Run, Location: "shop/postgres/orders/x", ManifestFile: "/dev/termination-log", Labels: []string{"namespace=shop", "name=orders", "note=a=b"},
			Compression: "none", KeepCount: 7, KeepMaxAge: 720 * time.Hour, Store: store, Postgres: true},
		{Sub: Run, Location: "l", Compression: CompressionZstd, Store: Store{Kind: Volume, VolumePath: "/backups", S3Region: DefaultS3Region}, Command: []string{"redis-cli", "--rdb", "-"}},
		{Sub: Restore, Location: "l", Compression: CompressionZstd, Store: store, ExpectSHA256: "9f86d0", ExpectSize: 1 << 40, Postgres: true, PrivilegedRoles: true},
		{Sub: Verify, Location: "l", Compression: CompressionZstd, Store: store, ExpectSHA256: "9f86d0", Scratch: true, IdentityFile: "/keys/age"},
	} {
		args := b.Args()
		if args[0] != b.Sub {
			t.Fatalf("%q: the subcommand is not first", args)
		}
		fs := flag.NewFlagSet("backup", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		got := Backup{Sub: args[0]}
		got.Register(fs)
		if err := fs.Parse(args[1:]); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if got.Command = fs.Args(); len(got.Command) == 0 {
			got.Command = nil
		}
		if !reflect.DeepEqual(got, b) {
			t.Errorf("%q parsed back as\n%+v, want\n%+v", args, got, b)
		}
	}
}

// TestMajorUpgradeArgsParseBack: the major upgrade Job's command line,
// parsed by the agent's flags, is what it was built from.
func TestMajorUpgradeArgsParseBack(t *testing.T) {
	for _, m := range []MajorUpgrade{
		{Bin: "/usr/lib/postgresql/17/bin", Data: "/var/lib/postgresql/data/pgdata", WorkDir: "/var/lib/postgresql/data/major-upgrade", Port: DefaultMajorUpgradePort, Report: "/dev/termination-log", MarkMoved: true},
		{Bin: "/pg17", ClientBin: "/pg15", Data: "/d", WorkDir: "/w", Port: 6543},
	} {
		fs := flag.NewFlagSet("major-upgrade", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var got MajorUpgrade
		got.Register(fs)
		if err := fs.Parse(m.Args()); err != nil {
			t.Fatalf("%q: %v", m.Args(), err)
		}
		if got != m {
			t.Errorf("%q parsed back as %+v, want %+v", m.Args(), got, m)
		}
	}
}

// TestWALArgsParseBack: a WAL command line, parsed by the agent's flags,
// is what it was built from.
func TestWALArgsParseBack(t *testing.T) {
	store := Store{Kind: S3, S3Bucket: "wal", S3Region: "eu-1"}
	for _, w := range []WAL{
		{Command: BaseBackup, Store: store, Prefix: "shop/orders", SegmentSize: DefaultWALSegmentSize, Parallel: DefaultWALParallel, Compression: CompressionZstd,
			Location: "shop/orders/base/x", ManifestFile: "/dev/termination-log"},
		{Command: Recover, Store: store, Prefix: "p", SegmentSize: 1 << 24, Parallel: 2, Compression: "none", DataDir: "/d", Base: "p/base/x",
			TargetTime: "2026-12-04T10:00:00Z", StagingDir: "/s", PostgresOptions: []string{"shared_buffers=32MB", "a=b=c"}, NewCluster: "db-primary", ManifestFile: "/dev/termination-log"},
		{Command: WALPrune, Store: store, Prefix: "p", SegmentSize: DefaultWALSegmentSize, Parallel: DefaultWALParallel, Compression: CompressionZstd, RecoveryWindow: "7d"},
		{Command: WALPush, Store: Store{S3Region: DefaultS3Region}, SegmentSize: DefaultWALSegmentSize, Parallel: DefaultWALParallel, Compression: CompressionZstd, Via: "/run/wal.sock", Args: []string{"pg_wal/000000010000000000000001"}},
	} {
		line := w.Line()
		if line[0] != w.Command {
			t.Fatalf("%q: the command is not first", line)
		}
		fs := flag.NewFlagSet(w.Command, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		got := WAL{Command: line[0]}
		got.Register(fs)
		if err := fs.Parse(line[1:]); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got.Args = fs.Args()
		if len(got.Args) == 0 {
			got.Args = nil
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%q parsed back as %+v, want %+v", line, got, w)
		}
	}
}
