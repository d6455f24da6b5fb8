// Package bundle generates chartpilot's OLM bundle (a ClusterServiceVersion,
// the CRDs and the bundle's annotations) from config/: the CRDs of
// config/crd, the manager's role of config/rbac (from `chartpilot rbac`),
// the Deployment of config/manager, the webhook of config/webhook and the
// samples of config/samples.
package bundle

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	"github.com/operator-framework/api/pkg/lib/version"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/chartpilot/chartpilot/internal/helm"
)

// Package is the bundle's OLM package, Channel its one channel.
const (
	Package = "chartpilot"
	Channel = "candidate"
)

// Capability is the Operator Capability Level the bundle declares: the
// highest level whose every part the end-to-end tests prove (Proofs).
const Capability = "Deep Insights"

// Proofs name, per level up to Capability, the tests that prove it.
var Proofs = map[string][]string{
	"Basic Install":     {"TestPostgresLifecycle", "TestRedisLifecycle", "TestOperatorChartInstallsAndRuns"},
	"Seamless Upgrades": {"TestPostgresMajorVersionNeedsOptIn", "TestStorageGrowsInPlace"},
	"Full Lifecycle":    {"TestScheduledBackups", "TestRestoreKeepsNotReady", "TestStorageGrowthSurvivesCrash"},
	"Deep Insights":     {"TestMonitoringWhenPrometheusOperatorArrives"},
}

// Options are the bundle's inputs.
type Options struct {
	// Root is the repository (config/ under it).
	Root string
	// Version of the operator (semver, without "v"); Image its image.
	Version, Image string
	// CreatedAt is the CSV's createdAt annotation (reproducible: the
	// commit's time).
	CreatedAt time.Time
}

// Write generates the bundle into dir (manifests/ and metadata/).
func Write(o Options, dir string) error {
	files, err := Generate(o)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Generate returns the bundle's files by path.
func Generate(o Options) (map[string][]byte, error) {
	v, err := semver.Parse(strings.TrimPrefix(o.Version, "v"))
	if err != nil {
		return nil, fmt.Errorf("version %q: %w", o.Version, err)
	}
	files := map[string][]byte{}
	crds, err := readCRDs(filepath.Join(o.Root, "config", "crd"))
	if err != nil {
		return nil, err
	}
	var owned []operatorsv1alpha1.CRDDescription
	for _, c := range crds {
		b, err := yaml.Marshal(c.raw)
		if err != nil {
			return nil, err
		}
		files["manifests/"+c.crd.Name+".yaml"] = b
		owned = append(owned, describe(c.crd))
	}
	roles := filepath.Join(o.Root, "config", "rbac", "role.yaml")
	clusterRules, err := clusterRoleRules(roles, "manager")
	if err != nil {
		return nil, err
	}
	nsRules, err := roleRules(filepath.Join(o.Root, "config", "rbac", "leader_election.yaml"))
	if err != nil {
		return nil, err
	}
	ownRules, err := roleRules(roles)
	if err != nil {
		return nil, err
	}
	nsRules = append(nsRules, ownRules...)
	// Locked down, each namespace's deployer is bound to this ClusterRole
	// (`chartpilot identity create`): a bundle object of its own.
	deployerRules, err := clusterRoleRules(roles, "deployer")
	if err != nil {
		return nil, err
	}
	deployer := rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: "chartpilot-deployer"}, Rules: deployerRules}
	b, err := yaml.Marshal(deployer)
	if err != nil {
		return nil, err
	}
	files["manifests/chartpilot-deployer.clusterrole.yaml"] = bytes.ReplaceAll(b, []byte("  creationTimestamp: null\n"), nil)
	dep, err := deployment(filepath.Join(o.Root, "config", "manager", "manager.yaml"), o.Image)
	if err != nil {
		return nil, err
	}
	webhook, err := webhookDescription(filepath.Join(o.Root, "config", "webhook", "manifests.yaml"), dep.Name)
	if err != nil {
		return nil, err
	}
	examples, err := almExamples(filepath.Join(o.Root, "config", "samples"))
	if err != nil {
		return nil, err
	}
	const sa = "chartpilot-manager"
	csv := operatorsv1alpha1.ClusterServiceVersion{
		TypeMeta: metav1.TypeMeta{APIVersion: operatorsv1alpha1.SchemeGroupVersion.String(), Kind: operatorsv1alpha1.ClusterServiceVersionKind},
		ObjectMeta: metav1.ObjectMeta{
			Name: Package + ".v" + v.String(),
			Annotations: map[string]string{
				"capabilities":   Capability,
				"categories":     "Database, Developer Tools",
				"containerImage": o.Image,
				"createdAt":      o.CreatedAt.UTC().Format(time.RFC3339),
				"repository":     "https://github.com/chartpilot/chartpilot",
				"support":        "chartpilot",
				"description":    "Turns custom resources into healthy Helm releases of middleware charts, with seamless upgrades, backups, monitoring, storage growth and tenants.",
				"alm-examples":   examples,
				"operators.operatorframework.io/suggested-namespace": "chartpilot-system",
			},
		},
		Spec: operatorsv1alpha1.ClusterServiceVersionSpec{
			DisplayName:    "chartpilot",
			Description:    description,
			Version:        opVersion(v),
			Maturity:       Channel,
			MinKubeVersion: "1.30.0",
			Keywords:       []string{"helm", "postgresql", "redis", "backup", "database", "operator"},
			Provider:       operatorsv1alpha1.AppLink{Name: "chartpilot", URL: "https://github.com/chartpilot/chartpilot"},
			Maintainers:    []operatorsv1alpha1.Maintainer{{Name: "chartpilot maintainers", Email: "maintainers@chartpilot.dev"}},
			Links: []operatorsv1alpha1.AppLink{
				{Name: "Source", URL: "https://github.com/chartpilot/chartpilot"},
				{Name: "Documentation", URL: "https://github.com/chartpilot/chartpilot#readme"},
			},
			Icon: []operatorsv1alpha1.Icon{{MediaType: "image/svg+xml", Data: icon}},
			InstallModes: []operatorsv1alpha1.InstallMode{
				{Type: operatorsv1alpha1.InstallModeTypeOwnNamespace, Supported: false},
				{Type: operatorsv1alpha1.InstallModeTypeSingleNamespace, Supported: false},
				{Type: operatorsv1alpha1.InstallModeTypeMultiNamespace, Supported: false},
				{Type: operatorsv1alpha1.InstallModeTypeAllNamespaces, Supported: true},
			},
			InstallStrategy: operatorsv1alpha1.NamedInstallStrategy{
				StrategyName: operatorsv1alpha1.InstallStrategyNameDeployment,
				StrategySpec: operatorsv1alpha1.StrategyDetailsDeployment{
					DeploymentSpecs:    []operatorsv1alpha1.StrategyDeploymentSpec{{Name: dep.Name, Spec: dep.Spec}},
					ClusterPermissions: []operatorsv1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: sa, Rules: clusterRules}},
					Permissions:        []operatorsv1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: sa, Rules: nsRules}},
				},
			},
			CustomResourceDefinitions: operatorsv1alpha1.CustomResourceDefinitions{Owned: owned},
			WebhookDefinitions:        []operatorsv1alpha1.WebhookDescription{webhook},
		},
	}
	csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.ServiceAccountName = sa
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&csv)
	if err != nil {
		return nil, err
	}
	delete(raw, "status")
	b, err = yaml.Marshal(raw)
	if err != nil {
		return nil, err
	}
	files["manifests/"+Package+".clusterserviceversion.yaml"] = bytes.ReplaceAll(b, []byte("  creationTimestamp: null\n"), nil)
	files["metadata/annotations.yaml"] = []byte(fmt.Sprintf(`annotations:
  operators.operatorframework.io.bundle.mediatype.v1: registry+v1
  operators.operatorframework.io.bundle.manifests.v1: manifests/
  operators.operatorframework.io.bundle.metadata.v1: metadata/
  operators.operatorframework.io.bundle.package.v1: %s
  operators.operatorframework.io.bundle.channels.v1: %s
  operators.operatorframework.io.bundle.channel.default.v1: %s
`, Package, Channel, Channel))
	return files, nil
}

const description = `chartpilot wraps existing middleware Helm charts: each custom resource becomes
a Helm release of its chart, installed, upgraded (health-checked, rolled back on
failure, canaries first across the fleet) and kept free of drift.

* **Postgres**: a typed kind with auto-tuning, scheduled and encrypted backups
  to S3, Google Cloud Storage, Azure Blob Storage or a volume, restores, restore drills, monitoring
  and volumes that grow in place or by themselves.
* **Redis**: a passthrough kind, its spec being the chart's values.
* **Tenant**: per-tenant values, limits and identities.
`

// opVersion wraps a semver version for the CSV.
func opVersion(v semver.Version) version.OperatorVersion {
	return version.OperatorVersion{Version: v}
}

func ptrIntOrString(port int) *intstr.IntOrString {
	p := intstr.FromInt32(int32(port))
	return &p
}

type crdFile struct {
	crd *apiextensionsv1.CustomResourceDefinition
	raw map[string]any
}

// readCRDs reads every CRD under dir, sorted by name.
func readCRDs(dir string) ([]crdFile, error) {
	var out []crdFile
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		docs, err := readDocs(p)
		if err != nil {
			return err
		}
		for _, doc := range docs {
			if doc.GetKind() != "CustomResourceDefinition" {
				continue
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			b, _ := json.Marshal(doc.Object)
			if err := json.Unmarshal(b, crd); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			out = append(out, crdFile{crd: crd, raw: doc.Object})
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].crd.Name < out[j].crd.Name })
	return out, err
}

func readDocs(p string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	objs, err := helm.ParseManifest(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return objs, nil
}

// describe is the CSV's description of an owned CRD, with descriptors
// for the fields a console shows.
func describe(crd *apiextensionsv1.CustomResourceDefinition) operatorsv1alpha1.CRDDescription {
	var version string
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			version = v.Name
		}
	}
	d := operatorsv1alpha1.CRDDescription{
		Name: crd.Name, Version: version, Kind: crd.Spec.Names.Kind,
		DisplayName: crd.Spec.Names.Kind,
		Description: descriptions[crd.Spec.Names.Kind],
		StatusDescriptors: []operatorsv1alpha1.StatusDescriptor{
			{Path: "conditions", DisplayName: "Conditions", Description: "Ready and the conditions it summarises", XDescriptors: []string{"urn:alm:descriptor:io.kubernetes.conditions"}},
		},
	}
	switch crd.Spec.Names.Kind {
	case "Postgres":
		d.SpecDescriptors = []operatorsv1alpha1.SpecDescriptor{
			{Path: "version", DisplayName: "PostgreSQL version", Description: "major or major.minor", XDescriptors: []string{"urn:alm:descriptor:com.tectonic.ui:text"}},
			{Path: "replicas", DisplayName: "Replicas", Description: "a primary and streaming replicas", XDescriptors: []string{"urn:alm:descriptor:com.tectonic.ui:podCount"}},
			{Path: "storage.size", DisplayName: "Storage size", Description: "each pod's data volume; grows, never shrinks", XDescriptors: []string{"urn:alm:descriptor:com.tectonic.ui:text"}},
			{Path: "resources", DisplayName: "Resources", Description: "CPU and memory per pod; PostgreSQL is tuned from them", XDescriptors: []string{"urn:alm:descriptor:com.tectonic.ui:resourceRequirements"}},
		}
		d.StatusDescriptors = append(d.StatusDescriptors,
			operatorsv1alpha1.StatusDescriptor{Path: "readyReplicas", DisplayName: "Ready replicas", XDescriptors: []string{"urn:alm:descriptor:com.tectonic.ui:podCount"}},
			operatorsv1alpha1.StatusDescriptor{Path: "endpoints.secret", DisplayName: "Credentials", XDescriptors: []string{"urn:alm:descriptor:io.kubernetes:Secret"}},
		)
	case "Redis":
		d.SpecDescriptors = []operatorsv1alpha1.SpecDescriptor{
			{Path: "persistence.size", DisplayName: "Storage size", XDescriptors: []string{"urn:alm:descriptor:com.tectonic.ui:text"}},
		}
	}
	return d
}

var descriptions = map[string]string{
	"Postgres":           "A PostgreSQL cluster (primary and streaming replicas) released from charts/postgresql",
	"Redis":              "A Redis server released from charts/redis; its spec is the chart's values",
	"Tenant":             "A tenant: its namespaces, values, limits and the identity its releases run as",
	"Backup":             "One backup of a resource, run as a Job and stored in a BackupStore",
	"BackupStore":        "Where the backups of a namespace go: S3, Google Cloud Storage, Azure Blob Storage or a volume",
	"ClusterBackupStore": "A backup store shared by the namespaces it selects",
}

// clusterRoleRules are the rules of ClusterRole name in file p.
func clusterRoleRules(p, name string) ([]rbacv1.PolicyRule, error) {
	docs, err := readDocs(p)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		if d.GetKind() == "ClusterRole" && d.GetName() == name {
			role := &rbacv1.ClusterRole{}
			b, _ := json.Marshal(d.Object)
			return role.Rules, json.Unmarshal(b, role)
		}
	}
	return nil, fmt.Errorf("%s: no ClusterRole %s", p, name)
}

// roleRules are the rules of every Role in file p.
func roleRules(p string) ([]rbacv1.PolicyRule, error) {
	docs, err := readDocs(p)
	if err != nil {
		return nil, err
	}
	var out []rbacv1.PolicyRule
	for _, d := range docs {
		if d.GetKind() == "Role" {
			role := &rbacv1.Role{}
			b, _ := json.Marshal(d.Object)
			if err := json.Unmarshal(b, role); err != nil {
				return nil, err
			}
			out = append(out, role.Rules...)
		}
	}
	if out == nil {
		return nil, fmt.Errorf("%s: no Role", p)
	}
	return out, nil
}

// deployment is config/manager's Deployment for OLM: its image, and the
// webhook's certificates from OLM (mounted where controller-runtime looks).
func deployment(p, image string) (*appsv1.Deployment, error) {
	docs, err := readDocs(p)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		if d.GetKind() != "Deployment" {
			continue
		}
		dep := &appsv1.Deployment{}
		b, _ := json.Marshal(d.Object)
		if err := json.Unmarshal(b, dep); err != nil {
			return nil, err
		}
		dep.Name = "chartpilot-" + dep.Name
		c := &dep.Spec.Template.Spec.Containers[0]
		c.Image = image
		var args []string
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--webhook-service=") || strings.HasPrefix(a, "--webhook-certs=") {
				continue
			}
			args = append(args, a)
		}
		c.Args = append(args, "--webhook-certs=files", "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs")
		// OLM mounts the webhook's certificates there itself.
		var mounts []corev1.VolumeMount
		for _, m := range c.VolumeMounts {
			if m.Name != "webhook-certs" {
				mounts = append(mounts, m)
			}
		}
		c.VolumeMounts = mounts
		var vols []corev1.Volume
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name != "webhook-certs" {
				vols = append(vols, v)
			}
		}
		dep.Spec.Template.Spec.Volumes = vols
		return dep, nil
	}
	return nil, fmt.Errorf("%s: no Deployment", p)
}

// webhookDescription is config/webhook's validating webhook for OLM, which
// makes its Service and certificates.
func webhookDescription(p, deploymentName string) (operatorsv1alpha1.WebhookDescription, error) {
	docs, err := readDocs(p)
	if err != nil {
		return operatorsv1alpha1.WebhookDescription{}, err
	}
	for _, d := range docs {
		if d.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		b, _ := json.Marshal(d.Object)
		if err := json.Unmarshal(b, cfg); err != nil {
			return operatorsv1alpha1.WebhookDescription{}, err
		}
		w := cfg.Webhooks[0]
		path := "/validate-chartpilot"
		if w.ClientConfig.Service != nil && w.ClientConfig.Service.Path != nil {
			path = *w.ClientConfig.Service.Path
		}
		return operatorsv1alpha1.WebhookDescription{
			GenerateName: w.Name, Type: operatorsv1alpha1.ValidatingAdmissionWebhook, DeploymentName: deploymentName,
			ContainerPort: 443, TargetPort: ptrIntOrString(9443),
			Rules: w.Rules, FailurePolicy: w.FailurePolicy, SideEffects: w.SideEffects, TimeoutSeconds: w.TimeoutSeconds,
			AdmissionReviewVersions: w.AdmissionReviewVersions, WebhookPath: &path,
		}, nil
	}
	return operatorsv1alpha1.WebhookDescription{}, fmt.Errorf("%s: no ValidatingWebhookConfiguration", p)
}

// almExamples is the samples as the alm-examples annotation (JSON).
func almExamples(dir string) (string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return "", err
	}
	sort.Strings(paths)
	var objs []map[string]any
	for _, p := range paths {
		docs, err := readDocs(p)
		if err != nil {
			return "", err
		}
		for _, d := range docs {
			objs = append(objs, d.Object)
		}
	}
	b, err := json.MarshalIndent(objs, "", "  ")
	return string(b), err
}

// icon is a small SVG (a ship's wheel) for the catalogue.
const icon = "PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciIHZpZXdCb3g9IjAgMCA2NCA2NCI+PGNpcmNsZSBjeD0iMzIiIGN5PSIzMiIgcj0iMjAiIGZpbGw9Im5vbmUiIHN0cm9rZT0iIzMyNmNlNSIgc3Ryb2tlLXdpZHRoPSI2Ii8+PGNpcmNsZSBjeD0iMzIiIGN5PSIzMiIgcj0iNiIgZmlsbD0iIzMyNmNlNSIvPjwvc3ZnPg=="
