package backup

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

// BuildAgent builds chartpilot, the agent the Jobs run, into a temporary
// directory.
func BuildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "chartpilot")
	cmd := exec.Command("go", "build", "-o", bin, "../../../cmd/chartpilot")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}
	return bin
}

// authority is a CA of the test's own, with what it issued.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue is a server certificate for 127.0.0.1 and localhost, PEM encoded
// with its key.
func (a *authority) issue(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// impostor answers PostgreSQL's protocol on loopback as a server the Job
// should not trust: it takes TLS with the certificate it is given (or
// refuses TLS without one), then asks for the password in clear text and
// keeps what it is sent.
type impostor struct {
	ln       net.Listener
	tls      *tls.Config
	mu       sync.Mutex
	conns    int
	startups int
	received [][]byte
}

func startImpostor(t *testing.T, certPEM, keyPEM []byte) *impostor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &impostor{ln: ln}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		f.tls = &tls.Config{Certificates: []tls.Certificate{pair}}
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(conn)
		}
	}()
	return f
}

func (f *impostor) port() int { return f.ln.Addr().(*net.TCPAddr).Port }

func (f *impostor) serve(conn net.Conn) {
	defer conn.Close()
	f.mu.Lock()
	f.conns++
	f.mu.Unlock()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	var c net.Conn = conn
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n, code := binary.BigEndian.Uint32(hdr[:4]), binary.BigEndian.Uint32(hdr[4:])
		if n < 8 || n > 10000 {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(n-8)); err != nil {
			return
		}
		switch {
		case code == 80877103 && f.tls != nil: // SSLRequest
			if _, err := c.Write([]byte("S")); err != nil {
				return
			}
			tc := tls.Server(c, f.tls)
			if err := tc.Handshake(); err != nil {
				return
			}
			c = tc
			continue
		case code == 80877103 || code == 80877104: // SSLRequest without TLS, GSSENCRequest
			if _, err := c.Write([]byte("N")); err != nil {
				return
			}
			continue
		}
		break
	}
	f.mu.Lock()
	f.startups++
	f.mu.Unlock()
	// AuthenticationCleartextPassword.
	if _, err := c.Write([]byte{'R', 0, 0, 0, 8, 0, 0, 0, 3}); err != nil {
		return
	}
	var hdr [5]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 10000 {
		return
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(c, body); err != nil {
		return
	}
	f.mu.Lock()
	f.received = append(f.received, append([]byte{hdr[0]}, body...))
	f.mu.Unlock()
}

func (f *impostor) seen() (conns, startups int, received [][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns, f.startups, f.received
}

// runAgainst runs job's command, the real agent, with the Job's
// environment (the Postgres Secret's password, the CA at caFile) against
// the server at port; paths of the pod are replaced by dir's. keep
// filters the environment (nil: all of it).
func runAgainst(t *testing.T, job *batchv1.Job, agent string, port int, password, caFile, dir string, keep func(string) bool) (string, error) {
	t.Helper()
	ctr := job.Spec.Template.Spec.Containers[0]
	env := []string{"PATH=" + testpg.Bin(t) + ":" + os.Getenv("PATH"), "PGCONNECT_TIMEOUT=10"}
	for _, e := range ctr.Env {
		v := e.Value
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			v = map[string]string{"username": "postgres", "password": password}[ref.SecretKeyRef.Key]
		}
		switch e.Name {
		case "PGHOST":
			v = "127.0.0.1"
		case "PGPORT":
			v = strconv.Itoa(port)
		case "PGSSLROOTCERT":
			v = caFile
		case "CHARTPILOT_STAGE_DIR":
			v = dir
		}
		if keep == nil || keep(e.Name) {
			env = append(env, e.Name+"="+v)
		}
	}
	replace := strings.NewReplacer("/backups", dir, "/var/lib/postgresql/data", dir, "/dev/termination-log", filepath.Join(dir, "termination-log"),
		"/usr/lib/postgresql/17/bin", testpg.Bin(t))
	args := append([]string{}, ctr.Command[1:]...)
	for _, a := range ctr.Args {
		args = append(args, replace.Replace(a))
	}
	if ctr.Name == "major-upgrade" {
		args = append(args, "--client-bin", testpg.Bin(t))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestJobsAuthenticateTheServer: the backup and the major upgrade Jobs
// give the superuser's password to no server but the one whose
// certificate the Postgres's CA signed. Whatever else answers the
// Service (no TLS, TLS with a certificate of another CA, or the right
// certificate asking for the password in clear text) gets no password;
// the real server, with TLS and SCRAM, is backed up.
func TestJobsAuthenticateTheServer(t *testing.T) {
	agent := BuildAgent(t)
	const password = "do-not-send-me-4e1f"
	ca, other := newAuthority(t, "orders PostgreSQL CA"), newAuthority(t, "someone else's CA")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	pg := &v1alpha1.Postgres{}
	pg.Namespace, pg.Name, pg.Spec.Version = "shop", "orders", "15"
	pg.Status.Endpoints = &v1alpha1.PostgresEndpoints{ReadWrite: "orders", Secret: "orders-auth", Port: 5432, CASecret: "orders-tls"}
	store := &resolvedStore{spec: v1alpha1.BackupStoreSpec{Volume: &v1alpha1.VolumeStore{ClaimName: "backups"}}}
	jobs := map[string]*batchv1.Job{
		"backup":        (&BackupReconciler{Deps: Deps{Image: "chartpilot:test", Deadline: time.Hour}}).job(testBackup("nightly", "ab12"), pg, store, "shop/postgres/orders/x"),
		"major upgrade": (&Major{AgentImage: "chartpilot:test"}).job(pg, &majorChange{pg: pg, from: "15", to: "17", next: "data-pg17", job: "orders-major-17"}, "data-pg17-orders-0"),
	}
	pg.Spec.Restore = &v1alpha1.PostgresRestore{FromBackup: "nightly"}
	restore := (&RestoreReconciler{Deps: Deps{Image: "chartpilot:test"}}).job(pg, store, "shop/postgres/orders/x", "", 0)
	for name, job := range map[string]*batchv1.Job{"backup": jobs["backup"], "major upgrade": jobs["major upgrade"], "restore": restore} {
		if v := job.Spec.Template.Spec.Volumes[len(job.Spec.Template.Spec.Volumes)-1]; v.Secret == nil || v.Secret.SecretName != "orders-tls" {
			t.Errorf("%s Job: last volume %+v, want the Secret orders-tls", name, v)
		}
		for _, env := range []string{"PGSSLMODE=verify-full", "PGSSLROOTCERT=" + ServerCADir + "/ca.crt", "PGCHANNELBINDING=require", "PGREQUIREAUTH=scram-sha-256"} {
			k, v, _ := strings.Cut(env, "=")
			if e := envOf(job.Spec.Template.Spec.Containers[0], k); e == nil || e.Value != v {
				t.Errorf("%s Job: %s = %v, want %s", name, k, e, v)
			}
		}
	}

	rightCert, rightKey := ca.issue(t)
	otherCert, otherKey := other.issue(t)
	for _, tc := range []struct {
		name      string
		cert, key []byte
	}{
		{"no TLS", nil, nil},
		{"a certificate of another CA", otherCert, otherKey},
		{"the server's certificate, asking for the password in clear text", rightCert, rightKey},
	} {
		for name, job := range jobs {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				f := startImpostor(t, tc.cert, tc.key)
				out, err := runAgainst(t, job, agent, f.port(), password, caFile, t.TempDir(), nil)
				if err == nil {
					t.Fatalf("the Job's command succeeded against the impostor:\n%s", out)
				}
				if strings.Contains(out, password) {
					t.Errorf("the password is in the command's output:\n%s", out)
				}
				conns, startups, received := f.seen()
				if conns == 0 {
					t.Fatalf("the command never reached the impostor:\n%s", out)
				}
				for _, m := range received {
					if bytes.Contains(m, []byte(password)) {
						t.Errorf("the impostor received the password (%q)", m)
					}
				}
				if tc.cert == nil && startups > 0 {
					t.Errorf("the command went on without TLS (%d startup messages)", startups)
				}
				t.Logf("refused: %s", lastLine(out))
			})
		}
	}

	// The impostor does take a password from a client that does not
	// authenticate the server (libpq's defaults): what the Jobs did
	// before.
	t.Run("control", func(t *testing.T) {
		f := startImpostor(t, nil, nil)
		libpqDefaults := func(k string) bool {
			return k != "PGSSLMODE" && k != "PGSSLROOTCERT" && k != "PGCHANNELBINDING" && k != "PGREQUIREAUTH"
		}
		if _, err := runAgainst(t, jobs["backup"], agent, f.port(), password, caFile, t.TempDir(), libpqDefaults); err == nil {
			t.Fatal("the command succeeded against the impostor")
		}
		if _, _, received := f.seen(); len(received) == 0 || !bytes.Contains(received[0], []byte(password)) {
			t.Fatalf("with libpq's defaults the impostor received %q, want the password: the impostor does not test what it should", received)
		}
	})

	// The real server, with the certificate the CA signed, TLS only and
	// SCRAM: the backup Job backs it up.
	t.Run("the server", func(t *testing.T) {
		s := testpg.Start(t)
		data := filepath.Join(s.Dir, "data")
		for file, b := range map[string][]byte{"server.crt": rightCert, "server.key": rightKey,
			"pg_hba.conf": []byte("local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n")} {
			path := filepath.Join(data, file)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(path, s.UID, s.GID); err != nil {
				t.Fatal(err)
			}
		}
		q := func(sql string) string {
			cmd := s.Command(map[string]string{"PGHOST": s.Dir, "PGPORT": strconv.Itoa(s.Port), "PGUSER": "postgres", "PGDATABASE": "postgres"}, "psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("psql %q: %v: %s", sql, err, out)
			}
			return strings.TrimSpace(string(out))
		}
		q("ALTER SYSTEM SET ssl = on")
		q("ALTER ROLE postgres PASSWORD '" + password + "'")
		q("SELECT pg_reload_conf()")
		q("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('over TLS')")
		dir := s.TempDir(t)
		if out, err := runAgainst(t, jobs["backup"], agent, s.Port, password, caFile, dir, nil); err != nil {
			t.Fatalf("the backup Job against the real server: %v\n%s", err, out)
		}
		msg, err := os.ReadFile(filepath.Join(dir, "termination-log"))
		if err != nil || !strings.Contains(string(msg), "sha256") {
			t.Fatalf("the backup Job's report: %v %s", err, msg)
		}
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
