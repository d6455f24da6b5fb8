package backup

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/redact"
)

// resolvedStore is a store a Backup may use, as its Job sees it.
type resolvedStore struct {
	spec v1alpha1.BackupStoreSpec
	// cluster: a ClusterBackupStore (the admin's own).
	cluster bool
	// secretNS is where the store's Secrets are.
	secretNS string
}

// resolveStore resolves the store ref that something of namespace ns (a
// Backup, a restore, a WAL archive) names: it exists, is Ready for its
// current spec, is offered to ns, and its Secrets are ones a Job of ns can
// use. c reads the stores (the cache), live the namespace. The string
// says why not; the bool whether waiting may help.
func resolveStore(ctx context.Context, c, live client.Reader, ns string, ref v1alpha1.StoreRef) (*resolvedStore, string, bool) {
	if ref.Kind == "ClusterBackupStore" {
		cs := &v1alpha1.ClusterBackupStore{}
		if err := c.Get(ctx, types.NamespacedName{Name: ref.Name}, cs); err != nil {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s: %v", ref.Name, redact.Error(err)), apierrors.IsNotFound(err)
		}
		if why := offered(ctx, live, cs, ns); why != "" {
			return nil, why, true
		}
		if why := notReady("ClusterBackupStore", cs.Name, cs.Generation, cs.Status.Conditions); why != "" {
			return nil, why, true
		}
		if s3 := cs.Spec.S3; s3 != nil && (s3.CredentialsSecretRef.Namespace != ns || (s3.CASecretRef != nil && s3.CASecretRef.Namespace != ns)) {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s keeps its S3 Secrets in namespace %s, which a backup Job of %s cannot read: use a BackupStore of %s, or a ClusterBackupStore whose Secrets are in %s", cs.Name, s3.CredentialsSecretRef.Namespace, ns, ns, ns), false
		}
		if az := cs.Spec.Azure; az != nil && az.CredentialsSecretRef.Namespace != ns {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s keeps its Azure Secret in namespace %s, which a backup Job of %s cannot read: use a BackupStore of %s, or a ClusterBackupStore whose Secret is in %s", cs.Name, az.CredentialsSecretRef.Namespace, ns, ns, ns), false
		}
		if g := cs.Spec.GCS; g != nil && g.CredentialsSecretRef != nil && g.CredentialsSecretRef.Namespace != ns {
			return nil, fmt.Sprintf("spec.store: ClusterBackupStore %s keeps its GCS Secret in namespace %s, which a backup Job of %s cannot read: use a BackupStore of %s, or a ClusterBackupStore whose Secret is in %s", cs.Name, g.CredentialsSecretRef.Namespace, ns, ns, ns), false
		}
		return &resolvedStore{spec: v1alpha1.BackupStoreSpec{S3: cs.Spec.S3, GCS: cs.Spec.GCS, Azure: cs.Spec.Azure, Volume: cs.Spec.Volume}, secretNS: ns, cluster: true}, "", true
	}
	s := &v1alpha1.BackupStore{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, s); err != nil {
		return nil, fmt.Sprintf("spec.store: BackupStore %s/%s: %v", ns, ref.Name, redact.Error(err)), apierrors.IsNotFound(err)
	}
	if why := notReady("BackupStore", s.Name, s.Generation, s.Status.Conditions); why != "" {
		return nil, why, true
	}
	return &resolvedStore{spec: s.Spec, secretNS: ns}, "", true
}

// offered says why cs does not serve namespace ns ("" when it does).
func offered(ctx context.Context, live client.Reader, cs *v1alpha1.ClusterBackupStore, ns string) string {
	if cs.Spec.NamespaceSelector == nil {
		return fmt.Sprintf("spec.store: ClusterBackupStore %s has no namespaceSelector and serves no namespace: ask an admin to select %s", cs.Name, ns)
	}
	sel, err := metav1.LabelSelectorAsSelector(cs.Spec.NamespaceSelector)
	if err != nil {
		return fmt.Sprintf("spec.store: ClusterBackupStore %s has an invalid namespaceSelector: %v", cs.Name, err)
	}
	n := &corev1.Namespace{}
	if err := live.Get(ctx, types.NamespacedName{Name: ns}, n); err != nil {
		return fmt.Sprintf("reading namespace %s: %v", ns, redact.Error(err))
	}
	if sel.Empty() || !sel.Matches(labels.Set(n.Labels)) {
		return fmt.Sprintf("spec.store: ClusterBackupStore %s does not serve namespace %s (its namespaceSelector does not select it): use a BackupStore of %s, or ask an admin", cs.Name, ns, ns)
	}
	return ""
}
