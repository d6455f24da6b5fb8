package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"filippo.io/age"
	"gocloud.dev/blob"

	"github.com/chartpilot/chartpilot/internal/agent/blobstore"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// namedStore is a store a test runs on.
type namedStore struct {
	name string
	b    *blob.Bucket
}

// testStores are a bucket of a real S3 server (versitygw), a container of
// Azurite (Azure Blob Storage's emulator), a bucket of fake-gcs-server
// (Google Cloud Storage's JSON API) and a directory,
// closed when the test ends, with the S3 server's settings.
func testStores(t *testing.T) (backup.S3, []namedStore) {
	t.Helper()
	s3cfg := backuptest.StartS3(t, t.TempDir())
	s3b, err := blobstore.OpenS3(context.Background(), s3cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s3b.Close() })
	dirb, err := backup.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dirb.Close() })
	azb, err := blobstore.OpenAzure(context.Background(), backuptest.StartAzure(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { azb.Close() })
	gcsb, err := blobstore.OpenGCS(context.Background(), backuptest.StartGCS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gcsb.Close() })
	return s3cfg, []namedStore{{"s3", s3b}, {"azure", azb}, {"gcs", gcsb}, {"volume", dirb}}
}

// seed makes database db with tables of several types and rows.
func seed(t *testing.T, pg *testpg.Server, db string, rows int) {
	t.Helper()
	pg.Query(t, "postgres", "create database "+db)
	pg.Query(t, db, fmt.Sprintf(`
create table customers (id int primary key, name text not null, created timestamptz not null, tags jsonb);
insert into customers select i, 'customer ' || i, timestamptz '2026-01-01' + i * interval '1 minute', jsonb_build_object('tier', i %% 3)
  from generate_series(1, %[1]d / 10) i;
create table orders (id bigint primary key, customer_id int references customers(id), amount numeric(12,2), note text, blob bytea);
insert into orders select i, 1 + i %% (%[1]d / 10), (i * 7.31) %% 1000, repeat(md5(i::text), 1 + i %% 4), decode(md5(i::text), 'hex')
  from generate_series(1, %[1]d) i;
create index on orders (customer_id);`, rows))
}

// fingerprint is every table's row count and a checksum of its rows in order.
func fingerprint(t *testing.T, pg *testpg.Server, db string) string {
	t.Helper()
	return pg.Query(t, db, `select string_agg(x, ' ' order by x) from (
  select 'customers:' || count(*) || ':' || md5(string_agg(c::text, ',' order by id)) as x from customers c
  union all
  select 'orders:' || count(*) || ':' || md5(string_agg(o::text, ',' order by id)) from orders o) s`)
}

// dump backs db up to location with pg_dump -Fc as the stream.
func dump(t *testing.T, pg *testpg.Server, b *blob.Bucket, db, location string, o backup.Options) (*backup.Manifest, error) {
	t.Helper()
	cmd := pg.Command(pg.Env(db), "pg_dump", "-Fc", "-Z0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m, werr := backup.Write(context.Background(), b, location, out, o)
	if werr != nil {
		_ = cmd.Process.Kill() // refused before the stream was read: the dump is not wanted
		_ = cmd.Wait()
		return nil, werr
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("pg_dump: %v: %s", err, stderr.String())
	}
	return m, werr
}

// restore restores the backup at location into a new database db with
// pg_restore reading the stream; pg_restore does not start when the backup
// does not open (corrupted, wrong key).
func restore(t *testing.T, pg *testpg.Server, b *blob.Bucket, location, identity, db string) error {
	t.Helper()
	r, _, err := backup.Open(context.Background(), b, location, identity, pg.TempDir(t), backup.Expect{})
	if err != nil {
		return err
	}
	defer r.Close()
	pg.Query(t, "postgres", "create database "+db)
	cmd := pg.Command(pg.Env(db), "pg_restore", "-d", db, "--no-owner", "--exit-on-error")
	cmd.Stdin = r
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v: %s", err, out)
	}
	return nil
}

// TestPostgresRoundTrip backs a seeded database up with pg_dump through the
// data path (zstd, age) to a real S3 server and to a directory, restores
// each into a fresh database with pg_restore, and compares every table's
// row count and checksum. A corrupted object is refused before pg_restore
// runs; a wrong key is named; the store's secret shows in no error.
func TestPostgresRoundTrip(t *testing.T) {
	pg := testpg.Start(t)
	seed(t, pg, "orders", 20000)
	want := fingerprint(t, pg, "orders")
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	s3cfg, stores := testStores(t)
	for i, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			loc := "orders/2026-11-30T120000Z"
			m, err := dump(t, pg, store.b, "orders", loc, backup.Options{Recipient: id.Recipient().String(), Labels: map[string]string{"databaseVersion": pg.Query(t, "postgres", "show server_version")}})
			if err != nil {
				t.Fatal(err)
			}
			if m.Size >= m.PlainSize {
				t.Errorf("stored %d bytes of a %d-byte dump: not compressed", m.Size, m.PlainSize)
			}
			db := fmt.Sprintf("restored_%d", i)
			if err := restore(t, pg, store.b, loc, id.String(), db); err != nil {
				t.Fatal(err)
			}
			if got := fingerprint(t, pg, db); got != want {
				t.Errorf("restored database differs:\n got %s\nwant %s", got, want)
			}
			if _, err := dump(t, pg, store.b, "orders", loc, backup.Options{}); !errors.Is(err, backup.ErrExists) {
				t.Errorf("a second backup to the same location: %v, want it refused", err)
			}
			other, _ := age.GenerateX25519Identity()
			if err := restore(t, pg, store.b, loc, other.String(), "never_a"); err == nil || !strings.Contains(err.Error(), "use the key it was made with") {
				t.Errorf("restore with another key: %v", err)
			}
			// Corrupt one byte of the stored object.
			data, err := store.b.ReadAll(context.Background(), loc+"/data")
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)/3] ^= 0x01
			if err := store.b.WriteAll(context.Background(), loc+"/data", data, nil); err != nil {
				t.Fatal(err)
			}
			if err := restore(t, pg, store.b, loc, id.String(), "never_b"); err == nil || !strings.Contains(err.Error(), "is corrupted") {
				t.Errorf("restore of a corrupted backup: %v", err)
			}
			if n := pg.Query(t, "postgres", "select count(*) from pg_database where datname like 'never_%'"); n != "0" {
				t.Errorf("a database was made for a backup that cannot be restored")
			}
		})
	}

	// Wrong credentials: the error says so and does not show the secret.
	bad := s3cfg
	bad.SecretAccessKey = "wrong-secret-also-never-shown"
	bb, err := blobstore.OpenS3(context.Background(), bad)
	if err != nil {
		t.Fatal(err)
	}
	defer bb.Close()
	_, err = backup.Write(context.Background(), bb, "x", strings.NewReader("data"), backup.Options{})
	if err == nil {
		t.Fatal("a backup with a wrong secret key was stored")
	}
	for _, secret := range []string{s3cfg.SecretAccessKey, bad.SecretAccessKey} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows a secret: %v", err)
		}
	}
	t.Logf("wrong credentials: %v", err)
}

// TestAzureWrongKey: a backup to Azure with a wrong account key fails
// with the service's refusal, without the key in the error, and stores
// nothing (the same data with the right key is then accepted).
func TestAzureWrongKey(t *testing.T) {
	az := backuptest.StartAzure(t, t.TempDir())
	good := az
	az.AccountKey = "d3Jvbmcta2V5LW5ldmVyLXNob3du"
	ctx := context.Background()
	b, err := blobstore.OpenAzure(ctx, az)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = backup.Write(ctx, b, "db/1", strings.NewReader(strings.Repeat("row\n", 10000)), backup.Options{})
	if err == nil || strings.Contains(err.Error(), az.AccountKey) {
		t.Fatalf("a backup with a wrong key: %v", err)
	}
	gb, err := blobstore.OpenAzure(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	if _, err := backup.Write(ctx, gb, "db/1", strings.NewReader("row\n"), backup.Options{}); err != nil {
		t.Errorf("the same location with the right key: %v (the refused backup left something behind?)", err)
	}
}

// TestGCSKeyChecked: a service account key that is not JSON is refused
// before anything is sent, without the key in the error; a bucket without
// credentials is only opened against an emulator's endpoint.
func TestGCSKeyChecked(t *testing.T) {
	ctx := context.Background()
	_, err := blobstore.OpenGCS(ctx, backup.GCS{Bucket: "b", ServiceAccountKey: "private-key-never-shown"})
	if err == nil || strings.Contains(err.Error(), "private-key-never-shown") || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("a key that is not JSON: %v", err)
	}
	if _, err := blobstore.OpenGCS(ctx, backup.GCS{Bucket: "b"}); err == nil || !strings.Contains(err.Error(), "service account key is required") {
		t.Errorf("no key and no endpoint: %v", err)
	}
	if _, err := blobstore.OpenGCS(ctx, backup.GCS{Endpoint: "ftp://x", Bucket: "b"}); err == nil || !strings.Contains(err.Error(), "gcs.endpoint") {
		t.Errorf("an endpoint that is not http(s): %v", err)
	}
}
