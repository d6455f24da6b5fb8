package backup

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// GoogleTokenURL is the token endpoint of Google's service account keys;
// a key naming another is refused unless the operator's admin allows it
// (a namespaced store's endpoints, --backup-store-endpoints).
const GoogleTokenURL = "https://oauth2.googleapis.com/token"

// maxKeySize bounds a service account key: real ones are about 2.3 KiB.
const maxKeySize = 16 << 10

// GCSKey is the one credential shape a GCS store accepts: a service
// account's JSON key. Google's client libraries also accept external
// accounts, impersonation and user credentials in the same file; those
// make the client read local files, call URLs and send what it read
// there (an external_account key's credential_source can name the
// manager's ServiceAccount token and a token_url of the key's author), so
// they are refused by shape, not by trust.
type GCSKey struct {
	Type                    string `json:"type"`
	ProjectID               string `json:"project_id,omitempty"`
	PrivateKeyID            string `json:"private_key_id,omitempty"`
	PrivateKey              string `json:"private_key"`
	ClientEmail             string `json:"client_email"`
	ClientID                string `json:"client_id,omitempty"`
	AuthURI                 string `json:"auth_uri,omitempty"`
	TokenURI                string `json:"token_uri,omitempty"`
	AuthProviderX509CertURL string `json:"auth_provider_x509_cert_url,omitempty"`
	ClientX509CertURL       string `json:"client_x509_cert_url,omitempty"`
	UniverseDomain          string `json:"universe_domain,omitempty"`
}

// ParseGCSKey reads a service account key, naming the field that is wrong
// and never quoting the key's secret parts.
func ParseGCSKey(key string) (GCSKey, error) {
	var k GCSKey
	if len(key) > maxKeySize {
		return k, fmt.Errorf("gcs credentials: the service account key is %d bytes, more than %d: use a service account's JSON key", len(key), maxKeySize)
	}
	var typed struct {
		Type any `json:"type"`
	}
	if err := json.Unmarshal([]byte(key), &typed); err != nil {
		return GCSKey{}, errors.New("gcs credentials: the service account key is not a JSON object")
	}
	if typed.Type != "service_account" {
		return GCSKey{}, fmt.Errorf("gcs credentials: the key's field type is %s: only a service account's key (type service_account) is accepted; create one with `gcloud iam service-accounts keys create`", clip(fmt.Sprintf("%q", fmt.Sprint(typed.Type))))
	}
	dec := json.NewDecoder(strings.NewReader(key))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		var unknown string
		if _, f, ok := strings.Cut(err.Error(), "unknown field "); ok {
			unknown = f
		}
		if unknown != "" {
			return GCSKey{}, fmt.Errorf("gcs credentials: the service account key has field %s, which a service account's key does not: only keys of type service_account are accepted", unknown)
		}
		return GCSKey{}, errors.New("gcs credentials: the service account key is not a service account's JSON key (a field has the wrong type)")
	}
	switch {
	case k.ClientEmail == "":
		return GCSKey{}, errors.New("gcs credentials: the key's field client_email is empty")
	case k.PrivateKey == "":
		return GCSKey{}, errors.New("gcs credentials: the key's field private_key is empty")
	case k.UniverseDomain != "" && k.UniverseDomain != "googleapis.com":
		return GCSKey{}, fmt.Errorf("gcs credentials: the key's field universe_domain is %q: only googleapis.com is accepted", clip(k.UniverseDomain))
	}
	if b, _ := pem.Decode([]byte(k.PrivateKey)); b == nil || len(bytes.TrimSpace(b.Bytes)) == 0 {
		return GCSKey{}, errors.New("gcs credentials: the key's field private_key is not a PEM private key")
	}
	if k.TokenURI != "" {
		if _, err := ParseEndpoint(k.TokenURI); err != nil {
			return GCSKey{}, fmt.Errorf("gcs credentials: the key's field token_uri: %w", err)
		}
	}
	return k, nil
}

// TokenURL is the token endpoint the key sends its signed assertion to.
func (k GCSKey) TokenURL() string {
	if k.TokenURI == "" {
		return GoogleTokenURL
	}
	return k.TokenURI
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Endpoint is a store's URL as it is compared: scheme, host and port, and
// a path; it has no user information, query or fragment.
type Endpoint struct {
	Scheme, Host string
	Port         int
	Path         string
}

// ParseEndpoint reads an http(s) URL without user information, query or
// fragment; the port defaults by scheme and the host is lower case.
func ParseEndpoint(raw string) (Endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Endpoint{}, fmt.Errorf("%q is not a URL", clip(raw))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return Endpoint{}, fmt.Errorf("%q is not an http(s) URL", clip(raw))
	case u.User != nil:
		return Endpoint{}, fmt.Errorf("%q holds user information (before @): name the host alone", clip(raw))
	case u.RawQuery != "" || u.Fragment != "" || strings.Contains(raw, "#"):
		return Endpoint{}, fmt.Errorf("%q has a query or fragment: name the server alone", clip(raw))
	case u.Hostname() == "":
		return Endpoint{}, fmt.Errorf("%q has no host", clip(raw))
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			return Endpoint{}, fmt.Errorf("%q: port %q is not a port", clip(raw), clip(p))
		}
		port = n
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	return Endpoint{Scheme: u.Scheme, Host: host, Port: port, Path: strings.TrimSuffix(u.EscapedPath(), "/")}, nil
}

// AnyPort is the Port of an allowed endpoint written with port "*".
const AnyPort = -1

// ParseAllowedEndpoint reads an endpoint the admin allows: an http(s) URL
// as ParseEndpoint reads it, whose port may be "*" (any port of the host).
func ParseAllowedEndpoint(raw string) (Endpoint, error) {
	anyPort := false
	if scheme, rest, ok := strings.Cut(raw, "://"); ok {
		host, path, _ := strings.Cut(rest, "/")
		if h, found := strings.CutSuffix(host, ":*"); found {
			raw, anyPort = scheme+"://"+h+"/"+path, true
		}
	}
	e, err := ParseEndpoint(raw)
	if err != nil {
		return Endpoint{}, err
	}
	if anyPort {
		e.Port = AnyPort
	}
	return e, nil
}

// Within reports whether e is allowed by a: the same scheme, host and
// port (any, for AnyPort), and a path at or below a's (on a segment
// boundary).
func (e Endpoint) Within(a Endpoint) bool {
	if e.Scheme != a.Scheme || e.Host != a.Host || (a.Port != AnyPort && e.Port != a.Port) {
		return false
	}
	return a.Path == "" || e.Path == a.Path || strings.HasPrefix(e.Path, a.Path+"/")
}

// EndpointAllowed reports whether raw parses and lies within one of the
// allowed endpoints (each read by ParseAllowedEndpoint; ones that do not
// parse allow nothing).
func EndpointAllowed(raw string, allowed []string) bool {
	e, err := ParseEndpoint(raw)
	if err != nil {
		return false
	}
	for _, a := range allowed {
		if ae, err := ParseAllowedEndpoint(a); err == nil && e.Within(ae) {
			return true
		}
	}
	return false
}
