package backup_test

import (
	"strings"
	"testing"

	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/backup/backuptest"
)

// serviceAccountKey is backuptest.ServiceAccountKey.
func serviceAccountKey(t *testing.T, mutate func(map[string]any)) string {
	t.Helper()
	return backuptest.ServiceAccountKey(t, mutate)
}

func TestGCSKeyShape(t *testing.T) {
	externalAccount := `{"type":"external_account","audience":"//iam.googleapis.com/x","subject_token_type":"urn:ietf:params:oauth:token-type:jwt",` +
		`"token_url":"http://127.0.0.1:1/token","credential_source":{"file":"/var/run/secrets/kubernetes.io/serviceaccount/token"}}`
	for _, tc := range []struct {
		name, key, want string
	}{
		{"a service account's key", serviceAccountKey(t, nil), ""},
		{"without token_uri", serviceAccountKey(t, func(k map[string]any) { delete(k, "token_uri") }), ""},
		{"an external account", externalAccount, `field type is "external_account"`},
		{"impersonation", `{"type":"impersonated_service_account","service_account_impersonation_url":"http://127.0.0.1:1/"}`, `field type is "impersonated_service_account"`},
		{"a user", `{"type":"authorized_user","client_id":"x","client_secret":"y","refresh_token":"z"}`, `field type is "authorized_user"`},
		{"no type", `{"client_email":"x"}`, `field type is "<nil>"`},
		{"a type that is not a string", `{"type":["service_account"]}`, "field type is"},
		{"credential_source smuggled into a service account", serviceAccountKey(t, func(k map[string]any) {
			k["credential_source"] = map[string]any{"url": "http://127.0.0.1:1/"}
		}), `field "credential_source"`},
		{"a token endpoint that is not a URL", serviceAccountKey(t, func(k map[string]any) { k["token_uri"] = "file:///etc/passwd" }), "token_uri"},
		{"user information in the token endpoint", serviceAccountKey(t, func(k map[string]any) { k["token_uri"] = "https://oauth2.googleapis.com@10.0.0.1/token" }), "user information"},
		{"another universe", serviceAccountKey(t, func(k map[string]any) { k["universe_domain"] = "evil.example" }), "universe_domain"},
		{"no private key", serviceAccountKey(t, func(k map[string]any) { k["private_key"] = "not-a-pem-never-shown" }), "private_key is not a PEM"},
		{"not JSON", "private-key-never-shown", "not a JSON object"},
		{"two objects", serviceAccountKey(t, nil) + "{}", "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := backup.ParseGCSKey(tc.key)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			case err != nil && (strings.Contains(err.Error(), "never-shown") || strings.Contains(err.Error(), "PRIVATE KEY")):
				t.Fatalf("the error shows the key: %v", err)
			}
		})
	}
}

func TestGCSTokenEndpointAllowed(t *testing.T) {
	own := serviceAccountKey(t, func(k map[string]any) { k["token_uri"] = "http://127.0.0.1:4443/token" })
	g := backup.GCS{Bucket: "b", ServiceAccountKey: own}
	if err := g.Validate(); err == nil || !strings.Contains(err.Error(), "token_uri") {
		t.Errorf("a token endpoint not allowed: %v", err)
	}
	g.AllowedTokenURLs = []string{"http://127.0.0.1:4443"}
	if err := g.Validate(); err != nil {
		t.Errorf("an allowed token endpoint: %v", err)
	}
	g.ServiceAccountKey = serviceAccountKey(t, nil)
	g.AllowedTokenURLs = nil
	if err := g.Validate(); err != nil {
		t.Errorf("Google's token endpoint: %v", err)
	}
}

// TestEndpointAllowed: endpoints are compared as parsed scheme, host, port
// and path, so that the spellings that pass a string prefix do not pass.
func TestEndpointAllowed(t *testing.T) {
	allowed := []string{"https://allowed", "http://127.0.0.1:*", "https://s3.example.com:9000/tenants"}
	for endpoint, want := range map[string]bool{
		"https://allowed":                           true,
		"https://ALLOWED/":                          true,
		"https://allowed:443/bucket":                true,
		"https://allowed@10.0.0.1/":                 false,
		"https://allowed.attacker.example":          false,
		"https://allowed:8443":                      false,
		"http://allowed":                            false,
		"https://allowed/?x=1":                      false,
		"https://allowed#frag":                      false,
		"http://127.0.0.1:1234":                     true,
		"http://127.0.0.1":                          true,
		"http://127.0.0.1.attacker.example:80":      false,
		"https://s3.example.com:9000/tenants/a":     true,
		"https://s3.example.com:9000/tenants":       true,
		"https://s3.example.com:9000/tenantsevil":   false,
		"https://s3.example.com:9000/":              false,
		"https://s3.example.com/tenants":            false,
		"ftp://allowed":                             false,
		"":                                          false,
		"https://u:p@s3.example.com:9000/tenants/a": false,
	} {
		if got := backup.EndpointAllowed(endpoint, allowed); got != want {
			t.Errorf("backup.EndpointAllowed(%q) = %v, want %v", endpoint, got, want)
		}
	}
	if _, err := backup.ParseAllowedEndpoint("https://x:*/p"); err != nil {
		t.Errorf("a port of *: %v", err)
	}
	if _, err := backup.ParseAllowedEndpoint("https://x:abc"); err == nil {
		t.Error("a port that is not a number was allowed")
	}
}
