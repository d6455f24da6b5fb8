package bundle

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"sigs.k8s.io/yaml"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
)

var root = filepath.Join("..", "..")

// TestBundleValidates: the generated bundle passes the validators
// operator-sdk's `bundle validate` runs, with the OperatorHub suite,
// standard capabilities and categories and good practices, with no error
// and no warning.
func TestBundleValidates(t *testing.T) {
	dir := t.TempDir()
	if err := Write(Options{Root: root, Version: "0.1.0", Image: "ghcr.io/chartpilot/chartpilot:v0.1.0", CreatedAt: time.Unix(0, 0)}, dir); err != nil {
		t.Fatal(err)
	}
	b, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		t.Fatalf("loading the bundle: %v", err)
	}
	if b.CSV == nil || len(b.V1CRDs) != 6 {
		t.Fatalf("bundle: CSV %v, %d CRDs", b.CSV != nil, len(b.V1CRDs))
	}
	validators := append(validation.DefaultBundleValidators,
		validation.OperatorHubV2Validator, validation.StandardCapabilitiesValidator, validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator, validation.AlphaDeprecatedAPIsValidator)
	for _, r := range validators.Validate(b, map[string]string{"k8s-version": "1.37"}) {
		for _, e := range r.Errors {
			t.Errorf("%s: error: %v", r.Name, e)
		}
		for _, w := range r.Warnings {
			// RBAC rules carry no API version, so a rule on policy's
			// poddisruptionbudgets (the charts' policy/v1 PDBs) reads to
			// the check as the removed policy/v1beta1.
			if strings.Contains(w.Error(), "removed in v1.25") && strings.Contains(w.Error(), "poddisruptionbudgets") {
				continue
			}
			t.Errorf("%s: warning: %v", r.Name, w)
		}
	}
	if got := b.CSV.Annotations["capabilities"]; got != Capability {
		t.Errorf("capabilities %q, want %q", got, Capability)
	}
}

// TestCapabilityIsProved: every level up to the declared one names tests,
// and each of them exists.
func TestCapabilityIsProved(t *testing.T) {
	levels := []string{"Basic Install", "Seamless Upgrades", "Full Lifecycle", "Deep Insights", "Auto Pilot"}
	var sources bytes.Buffer
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, "_test.go") && !strings.Contains(p, string(filepath.Separator)+"bin"+string(filepath.Separator)) {
			b, _ := os.ReadFile(p)
			sources.Write(b)
		}
		return nil
	})
	for _, l := range levels {
		tests, ok := Proofs[l]
		if !ok {
			if l == Capability {
				t.Errorf("level %s is declared and nothing proves it", l)
			}
			continue
		}
		for _, name := range tests {
			if !regexp.MustCompile(`(?m)^func ` + name + `\(t \*testing\.T\)`).Match(sources.Bytes()) {
				t.Errorf("level %s: test %s does not exist", l, name)
			}
		}
		if l == Capability {
			return
		}
	}
	t.Errorf("capability %q is not a level", Capability)
}

// TestCommittedBundleIsCurrent: bundle/ is what `make bundle` makes from
// config/ now.
func TestCommittedBundleIsCurrent(t *testing.T) {
	dir := filepath.Join(root, "bundle")
	raw, err := os.ReadFile(filepath.Join(dir, "manifests", Package+".clusterserviceversion.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	csv := &operatorsv1alpha1.ClusterServiceVersion{}
	if err := yaml.Unmarshal(raw, csv); err != nil {
		t.Fatal(err)
	}
	created, err := time.Parse(time.RFC3339, csv.Annotations["createdAt"])
	if err != nil {
		t.Fatal(err)
	}
	files, err := Generate(Options{Root: root, Version: csv.Spec.Version.String(), Image: csv.Annotations["containerImage"], CreatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		have, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(have, want) {
			t.Errorf("bundle/%s is not what make bundle makes from config/: run make bundle", name)
		}
	}
	entries, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	if len(entries) != len(files) {
		t.Errorf("bundle/ holds %d files, make bundle makes %d", len(entries), len(files))
	}
}
