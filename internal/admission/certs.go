package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Certificate lifetimes of the self-signed mode.
const (
	certValidity = 365 * 24 * time.Hour
	renewBefore  = 30 * 24 * time.Hour
	checkEvery   = time.Hour
)

// SelfSigned keeps a self-signed CA and a serving certificate for the
// webhook in the Secret (shared by every replica), renews them 30 days
// before they expire, writes them to Dir (tls.crt, tls.key, ca.crt: the
// webhook server reloads them when they change), and writes the CAs into
// the caBundle of the ValidatingWebhookConfiguration Config. A renewal
// keeps the previous CA in the bundle (Secret key ca-bundle.crt) until it
// expires: a replica still serving the previous certificate (it looks at
// the Secret hourly) is trusted meanwhile, and the bundle is in place
// before any replica serves the new one.
type SelfSigned struct {
	Dir      string
	DNSNames []string
	Config   string
	Secret   types.NamespacedName
	Client   client.Client
	Log      logr.Logger
	Now      func() time.Time
}

// NeedLeaderElection is false: every replica serves the webhook.
func (s *SelfSigned) NeedLeaderElection() bool { return false }

func (s *SelfSigned) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Start runs Ensure now and every hour until ctx ends (a manager Runnable).
func (s *SelfSigned) Start(ctx context.Context) error {
	for {
		if err := s.Ensure(ctx); err != nil {
			s.Log.Error(err, "Failed to ensure the webhook's certificates")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(checkEvery):
		}
	}
}

// Ensure creates or renews the certificates when needed and keeps the
// webhook configuration's caBundle equal to the CA.
func (s *SelfSigned) Ensure(ctx context.Context) error {
	secret := &corev1.Secret{}
	err := s.Client.Get(ctx, s.Secret, secret)
	switch {
	case apierrors.IsNotFound(err):
		files, err := s.generate()
		if err != nil {
			return err
		}
		files[bundleKey] = files["ca.crt"]
		secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.Secret.Namespace, Name: s.Secret.Name}, Type: corev1.SecretTypeTLS, Data: files}
		err = s.Client.Create(ctx, secret)
		switch {
		case apierrors.IsAlreadyExists(err):
			// Another replica starting at the same moment made them: use its.
			if err := s.Client.Get(ctx, s.Secret, secret); err != nil {
				return fmt.Errorf("reading Secret %s: %w", s.Secret, err)
			}
		case err != nil:
			return fmt.Errorf("storing webhook certificates in Secret %s: %w", s.Secret, err)
		default:
			s.Log.Info("Created self-signed webhook certificates", "secret", s.Secret.String(), "validUntil", s.now().Add(certValidity).Format(time.RFC3339))
		}
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", s.Secret, err)
	case s.expiring(secret.Data["tls.crt"]):
		files, err := s.generate()
		if err != nil {
			return err
		}
		previous := secret.Data[bundleKey]
		if len(previous) == 0 {
			previous = secret.Data["ca.crt"]
		}
		files[bundleKey] = append(append([]byte{}, files["ca.crt"]...), previous...)
		secret.Data = files
		// Optimistic locking: if another replica renewed first, this fails
		// and the next round reads its certificates.
		if err := s.Client.Update(ctx, secret); err != nil {
			return fmt.Errorf("renewing webhook certificates in Secret %s: %w", s.Secret, err)
		}
		s.Log.Info("Renewed self-signed webhook certificates", "secret", s.Secret.String())
	}
	bundle := secret.Data[bundleKey]
	if len(bundle) == 0 {
		bundle = secret.Data["ca.crt"]
	}
	// The bundle first: every certificate a replica may serve from here on
	// is trusted before this one serves it.
	if err := s.injectCA(ctx, unexpired(bundle, s.now(), secret.Data["ca.crt"])); err != nil {
		return err
	}
	return s.writeFiles(secret.Data)
}

// bundleKey holds, in the Secret, the current CA and the previous ones.
const bundleKey = "ca-bundle.crt"

// unexpired keeps the certificates of a PEM bundle that are valid at now,
// and always current (the CA that signs the serving certificate).
func unexpired(bundle []byte, now time.Time, current []byte) []byte {
	out := append([]byte{}, current...)
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return out
		}
		enc := pem.EncodeToMemory(block)
		if bytes.Contains(out, enc) {
			continue
		}
		if cert, err := x509.ParseCertificate(block.Bytes); err == nil && now.Before(cert.NotAfter) {
			out = append(out, enc...)
		}
	}
}

// expiring reports whether a PEM certificate is missing, unreadable or
// within renewBefore of its end.
func (s *SelfSigned) expiring(b []byte) bool {
	block, _ := pem.Decode(b)
	if block == nil {
		return true
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return true
	}
	return s.now().Add(renewBefore).After(cert.NotAfter)
}

// generate makes a CA and a serving certificate signed by it.
func (s *SelfSigned) generate() (map[string][]byte, error) {
	now := s.now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "chartpilot-webhook-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating webhook CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.DNSNames[0]},
		DNSNames:     s.DNSNames,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating webhook serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

// writeFiles writes the certificates to Dir when they differ; key first,
// certificate last, since the server reloads on the certificate.
func (s *SelfSigned) writeFiles(files map[string][]byte) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	for _, name := range []string{"tls.key", "ca.crt", "tls.crt"} {
		path := filepath.Join(s.Dir, name)
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, files[name]) {
			continue
		}
		tmp := filepath.Join(s.Dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, files[name], 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// injectCA sets caBundle on every webhook of the configuration.
func (s *SelfSigned) injectCA(ctx context.Context, ca []byte) error {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := s.Client.Get(ctx, types.NamespacedName{Name: s.Config}, vwc); err != nil {
		return fmt.Errorf("reading ValidatingWebhookConfiguration %s (install config/webhook): %w", s.Config, err)
	}
	patch := client.MergeFrom(vwc.DeepCopy())
	changed := false
	for i := range vwc.Webhooks {
		if !bytes.Equal(vwc.Webhooks[i].ClientConfig.CABundle, ca) {
			vwc.Webhooks[i].ClientConfig.CABundle = ca
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return s.Client.Patch(ctx, vwc, patch)
}
