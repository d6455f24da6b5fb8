package backup

import (
	"context"
	"fmt"
	"sync"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/identity"
	"github.com/chartpilot/chartpilot/internal/redact"
)

// Identity creates the Jobs of backups, restores and drills as the user
// the target resource's writes run as (its Tenant's ServiceAccount, the
// watch's serviceAccountName or --default-service-account): what that
// user may not do in the namespace, a Backup cannot make chartpilot do
// there. The Job's pod runs as that ServiceAccount (without its token).
type Identity struct {
	// Config is the manager's; clients impersonate from it.
	Config *rest.Config
	// Of returns the user of a resource ("system:serviceaccount:NS:NAME"),
	// or "" for the manager itself.
	Of func(ctx context.Context, target *unstructured.Unstructured) (string, error)

	mu      sync.Mutex
	clients map[string]client.Client
}

// createJob creates job for target: as target's identity when there is
// one, else with c. The error, for a refusal, names the user and the fix.
func (id *Identity) createJob(ctx context.Context, c client.Client, target *unstructured.Unstructured, job *batchv1.Job) error {
	as, user, err := id.clientFor(ctx, c, target)
	if err != nil {
		return err
	}
	if ns, name, ok := identity.ParseServiceAccount(user); ok && ns == job.Namespace {
		job.Spec.Template.Spec.ServiceAccountName = name
	}
	err = as.Create(ctx, job)
	switch {
	case err == nil || apierrors.IsAlreadyExists(err):
		return nil
	case apierrors.IsForbidden(err) && user != "":
		return &refused{fmt.Sprintf("%s may not create Job %s in %s: grant it create on jobs.batch there (backups run as the resource's identity)", user, job.Name, job.Namespace)}
	}
	return fmt.Errorf("creating Job %s: %w", job.Name, redact.Error(err))
}

// create creates obj (of resource, e.g. "persistentvolumeclaims") for
// target, as target's identity when there is one; one that exists is left.
func (id *Identity) create(ctx context.Context, c client.Client, target *unstructured.Unstructured, obj client.Object, resource string) error {
	as, user, err := id.clientFor(ctx, c, target)
	if err != nil {
		return err
	}
	err = as.Create(ctx, obj)
	switch {
	case err == nil || apierrors.IsAlreadyExists(err):
		return nil
	case apierrors.IsForbidden(err) && user != "":
		return &refused{fmt.Sprintf("%s may not create %s %s in %s: grant it create on %s there (chartpilot acts as the resource's identity)", user, resource, obj.GetName(), obj.GetNamespace(), resource)}
	}
	return fmt.Errorf("creating %s %s: %w", resource, obj.GetName(), redact.Error(err))
}

// refused is a Job the identity may not create: the Backup fails with it.
type refused struct{ msg string }

func (r *refused) Error() string { return r.msg }

func (id *Identity) clientFor(ctx context.Context, c client.Client, target *unstructured.Unstructured) (client.Client, string, error) {
	if id == nil || id.Of == nil {
		return c, "", nil
	}
	user, err := id.Of(ctx, target)
	if err != nil || user == "" {
		return c, "", err
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if cl, ok := id.clients[user]; ok {
		return cl, user, nil
	}
	cfg := rest.CopyConfig(id.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cl, err := client.New(cfg, client.Options{Scheme: c.Scheme(), Mapper: c.RESTMapper()})
	if err != nil {
		return nil, "", err
	}
	if id.clients == nil {
		id.clients = map[string]client.Client{}
	}
	id.clients[user] = cl
	return cl, user, nil
}
