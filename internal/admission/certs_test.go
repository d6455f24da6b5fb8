package admission

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster"
)

var cluster *testcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(testcluster.RunMain(m, testcluster.Options{Tier: testcluster.TierAPI}, &cluster))
}

func TestSelfSignedCertificatesCreatedInjectedRenewed(t *testing.T) {
	ns := cluster.Namespace(t)
	ctx := context.Background()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	none := admissionregistrationv1.SideEffectClassNone
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "test-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "validate.chartpilot.dev",
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             &none,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "webhook", Path: ptr.To(Path)}},
		}},
	}
	if err := c.Create(ctx, vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(ctx, vwc) })
	now := time.Now()
	dir := t.TempDir()
	s := &SelfSigned{
		Dir: dir, DNSNames: []string{"webhook." + ns + ".svc"}, Config: vwc.Name,
		Secret: types.NamespacedName{Namespace: ns, Name: "webhook-certs"}, Client: c, Log: logr.Discard(),
		Now: func() time.Time { return now },
	}
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	caPEM := verify(t, dir, "webhook."+ns+".svc", now)
	if err := c.Get(ctx, types.NamespacedName{Name: vwc.Name}, vwc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(vwc.Webhooks[0].ClientConfig.CABundle, caPEM) {
		t.Fatal("caBundle is not the CA")
	}
	// A second replica with an empty directory gets the same certificates.
	dir2 := t.TempDir()
	s2 := *s
	s2.Dir = dir2
	if err := s2.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(verify(t, dir2, "webhook."+ns+".svc", now), caPEM) {
		t.Fatal("a second replica made its own CA")
	}
	// 340 days later (within 30 days of expiry) they are renewed everywhere.
	later := now.Add(340 * 24 * time.Hour)
	s.Now = func() time.Time { return later }
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	renewed := verify(t, dir, "webhook."+ns+".svc", later)
	if bytes.Equal(renewed, caPEM) {
		t.Fatal("certificates not renewed near expiry")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: vwc.Name}, vwc); err != nil {
		t.Fatal(err)
	}
	// The bundle trusts the new certificate and, until the other replica
	// has read the Secret again, the previous one it still serves.
	bundle := vwc.Webhooks[0].ClientConfig.CABundle
	verifyWith(t, bundle, dir, "webhook."+ns+".svc", later)
	verifyWith(t, bundle, dir2, "webhook."+ns+".svc", later)
	if err := s2.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(verify(t, dir2, "webhook."+ns+".svc", later), renewed) {
		t.Fatal("the other replica did not take the renewed certificates")
	}
	// Once the previous CA has expired, the bundle holds the new one only.
	expired := now.Add(certValidity + time.Hour)
	s.Now = func() time.Time { return expired }
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Name: vwc.Name}, vwc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(vwc.Webhooks[0].ClientConfig.CABundle, renewed) {
		t.Fatalf("caBundle after the previous CA expired holds %d bytes, want the renewed CA only", len(vwc.Webhooks[0].ClientConfig.CABundle))
	}
}

// verifyWith checks that tls.crt in dir verifies for host at time at with
// the CAs of bundle.
func verifyWith(t *testing.T, bundle []byte, dir, host string, at time.Time) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("caBundle holds no certificate")
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, CurrentTime: at}); err != nil {
		t.Fatalf("the certificate served from %s does not verify with caBundle: %v", dir, err)
	}
}

// verify checks that tls.crt in dir is valid for host at time at, signed by
// ca.crt, and returns ca.crt.
func verify(t *testing.T, dir, host string, at time.Time) []byte {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, CurrentTime: at}); err != nil {
		t.Fatalf("serving certificate does not verify: %v", err)
	}
	return caPEM
}
