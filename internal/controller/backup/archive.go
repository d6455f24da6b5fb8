package backup

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/jobspec"
)

// Archive is the values layer of spec.backup.walArchive: the chart's
// walArchive values that make every pod's server archive its WAL to the
// Postgres's backup store. The store is resolved as a Backup's is (it
// exists, is Ready, serves the namespace, keeps its Secrets there); the
// credentials reach the pods only as references to those Secrets.
type Archive struct {
	// Client reads stores (cached); Reader reads namespaces.
	Client client.Client
	Reader client.Reader
}

// reasonArchiveStore is the reason of the hook's condition while the
// archive's store cannot be used.
const reasonArchiveStore = "WALArchiveStoreUnusable"

// values is the layer; nil for a Postgres without spec.backup.walArchive
// (the chart's default, or what spec.values says, stays).
func (a *Archive) values(ctx context.Context, obj hooks.Object) (map[string]any, error) {
	pg, err := a.postgresOf(obj)
	if pg == nil || err != nil {
		return nil, err
	}
	sb := pg.Spec.Backup
	if sb == nil || sb.WALArchive == nil {
		return nil, nil
	}
	// Archiving waits for the store; nothing of the release changes.
	st, err := a.storeFor(ctx, pg, sb.Store, "spec.backup.walArchive", "spec.backup.store", reasonArchiveStore)
	if err != nil {
		return nil, err
	}
	v, err := archiveValues(pg, st)
	if err != nil {
		return nil, hooks.Reject(reasonArchiveStore, "%s", err.Error())
	}
	return v, nil
}

// postgresOf is the Postgres obj is; nil for another kind.
func (a *Archive) postgresOf(obj hooks.Object) (*v1alpha1.Postgres, error) {
	u := obj.Resource
	if a == nil || u == nil || u.GetKind() != "Postgres" {
		return nil, nil
	}
	pg := &v1alpha1.Postgres{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pg); err != nil {
		return nil, fmt.Errorf("reading the Postgres: %w", err)
	}
	return pg, nil
}

// storeFor resolves store ref of pg for what (a field), named at field
// in messages: a store that may still come makes the release wait, any
// other problem refuses it, with reason.
func (a *Archive) storeFor(ctx context.Context, pg *v1alpha1.Postgres, ref v1alpha1.StoreRef, what, field, reason string) (*resolvedStore, error) {
	st, why, mayWait := resolveStore(ctx, a.Client, a.Reader, pg.Namespace, ref)
	if st != nil {
		return st, nil
	}
	why = what + ": " + strings.Replace(why, "spec.store", field, 1)
	if mayWait {
		return nil, hooks.Wait(reason, "%s", why)
	}
	return nil, hooks.Reject(reason, "%s", why)
}

// archiveValues are the chart's walArchive values for pg archiving to st.
func archiveValues(pg *v1alpha1.Postgres, st *resolvedStore) (map[string]any, error) {
	sb := pg.Spec.Backup
	wa := sb.WALArchive
	prefix, err := archivePrefix(pg, st)
	if err != nil {
		return nil, err
	}
	store, env, _, _ := jobspec.StoreFlags(st.spec)
	args := store.Args()
	if sb.Compression != "" {
		args = append(args, "--compression", sb.Compression)
	}
	if e := sb.Encryption; e != nil {
		env = append(env, corev1.EnvVar{Name: agentargs.EnvAgeKey, ValueFrom: secretKey(e.KeySecretRef.Name, e.KeySecretRef.Key)})
	}
	words, err := archiveWords(sb.Store.Name, args)
	if err != nil {
		return nil, err
	}
	secretEnv := make([]any, 0, len(env))
	for _, e := range env {
		ref := e.ValueFrom.SecretKeyRef
		secretEnv = append(secretEnv, map[string]any{"name": e.Name, "secretName": ref.Name, "key": ref.Key})
	}
	w := map[string]any{"enabled": true, "prefix": prefix, "storeArgs": words, "secretEnv": secretEnv}
	if t := wa.ArchiveTimeout; t != nil {
		secs := int64(t.Duration.Seconds())
		if secs < 1 || secs > 3600 {
			return nil, fmt.Errorf("spec.backup.walArchive.archiveTimeout %s: set whole seconds from 1s to 1h", t.Duration)
		}
		w["timeout"] = fmt.Sprintf("%ds", secs)
	}
	if s3 := st.spec.S3; s3 != nil && s3.CASecretRef != nil {
		w["ca"] = map[string]any{"secretName": s3.CASecretRef.Name, "key": s3.CASecretRef.Key}
	}
	return map[string]any{"walArchive": w}, nil
}

// archivePrefix is where pg's WAL archive is in store st (its base
// backups below it, in base/): spec.backup.walArchive.prefix (default
// NAMESPACE/NAME), then pgMAJOR, since each major has an archive of its
// own (a major upgrade starts a new server, whose WAL file names begin
// again).
func archivePrefix(pg *v1alpha1.Postgres, st *resolvedStore) (string, error) {
	sb := pg.Spec.Backup
	if st.spec.Volume != nil {
		return "", fmt.Errorf("spec.backup.walArchive: store %s is a volume, which the server's pods do not mount: archive the WAL to an s3, gcs or azure store", sb.Store.Name)
	}
	prefix := sb.WALArchive.Prefix
	def := pg.Namespace + "/" + pg.Name
	if prefix == "" {
		prefix = def
	}
	if err := confinedPrefix("spec.backup.walArchive.prefix", prefix, def, pg.Namespace, sb.Store.Name, st.cluster); err != nil {
		return "", err
	}
	return prefix + "/pg" + majorOf(pg.Spec.Version), nil
}

// confinedPrefix checks an archive's prefix (field; def when left out):
// names only, and on a ClusterBackupStore, which namespaces share, below
// the namespace's own name: a namespace archives and reads there only,
// never another's archive.
func confinedPrefix(field, prefix, def, ns, store string, cluster bool) error {
	for _, seg := range strings.Split(prefix, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("%s %q: a segment . or .. names no place of its own in the store: use names only", field, prefix)
		}
	}
	if cluster && prefix != ns && !strings.HasPrefix(prefix, ns+"/") {
		return fmt.Errorf("%s %q: store %s is a ClusterBackupStore, shared between namespaces: the prefix must begin with %q (or be left out: %s)",
			field, prefix, store, ns+"/", def)
	}
	return nil
}

// archiveWord is what the chart lets into archive_command: one flag with
// its value, of characters that need no quoting in postgresql.conf or sh.
var archiveWord = regexp.MustCompile(`^--[a-z0-9-]+(=[A-Za-z0-9_./:@+,-]*)?$`)

// archiveWords are the agent's flags (as storeFlags gives them, "--flag",
// "value") as the chart's storeArgs words ("--flag=value").
func archiveWords(store string, args []string) ([]any, error) {
	var out []any
	for i := 0; i < len(args); i++ {
		w := args[i]
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			w += "=" + args[i+1]
			i++
		}
		if !archiveWord.MatchString(w) {
			return nil, fmt.Errorf("spec.backup.walArchive: the store %s gives the agent %q, which holds a character archive_command cannot carry unquoted (letters, digits and _./:@+,- only): use a store whose endpoint, bucket and prefix keep to them", store, w)
		}
		out = append(out, w)
	}
	return out, nil
}

// mergeLayers joins values layers whose top-level keys do not overlap.
func mergeLayers(fs ...hooks.ValuesFunc) hooks.ValuesFunc {
	return func(ctx context.Context, obj hooks.Object) (map[string]any, error) {
		var out map[string]any
		for _, f := range fs {
			v, err := f(ctx, obj)
			if err != nil {
				return nil, err
			}
			for k, x := range v {
				if out == nil {
					out = map[string]any{}
				}
				out[k] = x
			}
		}
		return out, nil
	}
}

// Watch wakes the Postgreses of a namespace when a BackupStore there, and
// every one when a ClusterBackupStore, is created, deleted, or becomes
// Ready or not (a store's periodic check that changes nothing wakes none):
// an archive waiting for its store starts as soon as it can.
func (a *Archive) Watch(mgr manager.Manager, c controller.Controller, enqueue hooks.EnqueueFunc) error {
	err := c.Watch(source.Kind(mgr.GetCache(), &v1alpha1.BackupStore{}, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, s *v1alpha1.BackupStore) []reconcile.Request {
		return enqueue(ctx, []string{s.Namespace})
	}), readinessChanged[*v1alpha1.BackupStore](func(s *v1alpha1.BackupStore) (int64, []metav1.Condition) {
		return s.Generation, s.Status.Conditions
	})))
	if err != nil {
		return err
	}
	return c.Watch(source.Kind(mgr.GetCache(), &v1alpha1.ClusterBackupStore{}, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ *v1alpha1.ClusterBackupStore) []reconcile.Request {
		return enqueue(ctx, nil)
	}), readinessChanged[*v1alpha1.ClusterBackupStore](func(s *v1alpha1.ClusterBackupStore) (int64, []metav1.Condition) {
		return s.Generation, s.Status.Conditions
	})))
}

// readinessChanged passes creations, deletions, and updates that change
// whether the object is Ready for its generation (what notReady reads).
func readinessChanged[T client.Object](state func(T) (int64, []metav1.Condition)) predicate.TypedPredicate[T] {
	return predicate.TypedFuncs[T]{
		UpdateFunc: func(e event.TypedUpdateEvent[T]) bool {
			ready := func(o T) bool { g, c := state(o); return notReady("", "", g, c) == "" }
			return ready(e.ObjectOld) != ready(e.ObjectNew)
		},
		GenericFunc: func(event.TypedGenericEvent[T]) bool { return false },
	}
}
