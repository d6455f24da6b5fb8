package cliutil

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckPortFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	err = CheckPortFree(addr, "--metrics-bind-address")
	if err == nil || !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), "--metrics-bind-address") {
		t.Fatalf("busy port: want an error naming the flag, got %v", err)
	}
	_ = l.Close()
	if err := CheckPortFree(addr, "--metrics-bind-address"); err != nil {
		t.Fatalf("freed port reported busy: %v", err)
	}
	if err := CheckPortFree("0", "--metrics-bind-address"); err != nil {
		t.Fatalf("disabled address rejected: %v", err)
	}
}

func TestLoadKubeconfigErrorsNameTheFix(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("this: [is not: a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		path string
		want []string
	}{
		"missing":     {filepath.Join(dir, "nope"), []string{"cannot be read", "--kubeconfig"}},
		"not yaml":    {garbage, []string{"does not parse", "--kubeconfig"}},
		"no contexts": {empty, []string{"not usable", "current-context"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadKubeconfig(tc.path)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Count(err.Error(), "\n") > 0 {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
}

func TestCheckFileReadable(t *testing.T) {
	err := CheckFileReadable(filepath.Join(t.TempDir(), "watches.yaml"), "--watches")
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "--watches") {
		t.Fatalf("want a clear error, got %v", err)
	}
	f := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckFileReadable(f, "--watches"); err != nil {
		t.Fatal(err)
	}
}
