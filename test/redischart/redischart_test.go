// Package redischart runs what charts/redis renders for its container's
// command line in a real shell, with a stand-in redis-server that writes
// down the arguments it was given.
package redischart

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// TestExtraArgsAreNotShellText: extraArgs with command substitutions,
// backquotes and variables reach redis-server as the very strings
// written, one argument each; nothing in them runs.
func TestExtraArgsAreNotShellText(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	extra := []any{"--save", "60 1", "$(touch " + marker + ")", "`touch " + marker + "`", "${HOME}", "a;touch " + marker}
	ch, err := helm.LoadChart(filepath.Join("..", "..", "charts", "redis"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := helm.Template(ch, "cache", "default", map[string]any{"extraArgs": extra, "auth": map[string]any{"enabled": false}}, "")
	if err != nil {
		t.Fatalf("rendering charts/redis: %v", err)
	}
	objs, err := helm.ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var argv []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" {
			continue
		}
		// Both kinds hold the pod template at the same place.
		d := &appsv1.Deployment{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "redis" {
				argv = append(append(argv, c.Command...), c.Args...)
			}
		}
	}
	if len(argv) < 3 || argv[0] != "sh" || argv[1] != "-c" {
		t.Fatalf("the redis container runs %q, not sh -c", argv)
	}
	// The stand-in redis-server writes each argument on a line.
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	seen := filepath.Join(dir, "args")
	if err := os.WriteFile(filepath.Join(bin, "redis-server"), []byte("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > "+seen+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", argv[1:]...)
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "HOME=/home/redis"}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("running the rendered command: %v\n%s", err, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a command in extraArgs ran")
	}
	got, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	tail := args[len(args)-len(extra):]
	for i, want := range extra {
		if tail[i] != want {
			t.Errorf("argument %d reached redis-server as %q, want %q (all: %q)", i, tail[i], want, args)
		}
	}
}
