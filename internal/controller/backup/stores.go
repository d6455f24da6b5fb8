// Package backup holds the backup controllers (StoreReconciler,
// BackupReconciler, ScheduleReconciler with its drills, RestoreReconciler)
// and the hooks of the release reconciler that share their store
// resolution, identity and Job following: Hook (a restore before install,
// the Restored condition, the backup before a major upgrade), Major (the
// major upgrade), Archive (the WAL archive's values) and Restores
// (passthrough restores).
package backup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/redact"
)

// Recheck is how often a store is checked again.
const Recheck = 10 * time.Minute

// ClaimRecheck is how soon a volume store whose claim does not exist or is
// not bound is looked at again (one read of the claim); in its first
// minutes, when a claim applied beside it usually binds, every
// ClaimRecheckEarly.
const (
	ClaimRecheck      = 15 * time.Second
	ClaimRecheckEarly = 2 * time.Second
)

// claimRecheck is ClaimRecheckEarly for a store created less than two
// minutes ago, ClaimRecheck after. A store's own status writes do not
// wake it, so this is what notices the claim bind.
func claimRecheck(created time.Time) time.Duration {
	if time.Since(created) < 2*time.Minute {
		return ClaimRecheckEarly
	}
	return ClaimRecheck
}

// probeTimeout bounds one check of a store's claim.
const probeTimeout = 30 * time.Second

// reasonBusy: the store helper had no slot for the store's namespace;
// nothing was checked, and the store is looked at again shortly.
const reasonBusy = "Busy"

// busyRecheck is when a check that found the helper busy runs again: 2 to
// 4 s, spread so that waiting checks do not all come back at once.
func busyRecheck() time.Duration {
	return 2*time.Second + time.Duration(rand.Int64N(int64(2*time.Second)))
}

// helperNamespace is the namespace whose helper slots a request takes: a
// namespaced store's own, or "" for the admin's cluster-wide stores.
func helperNamespace(cluster bool, namespace string) string {
	if cluster {
		return ""
	}
	return namespace
}

// withDefaults fills a controller's clock and Job deadline when unset
// (deadline may be nil: no Jobs of its own to bound).
func withDefaults(now *func() time.Time, deadline *time.Duration) {
	if *now == nil {
		*now = time.Now
	}
	if deadline != nil && *deadline == 0 {
		*deadline = DefaultDeadline
	}
}

// options are the controller options of every backup controller.
func options(skipNameValidation bool) controller.Options {
	return controller.Options{SkipNameValidation: &skipNameValidation, MaxConcurrentReconciles: Workers}
}

// Workers is how many stores (Backups, restores, schedules) each
// controller handles at once: a store that does not answer holds one
// worker for probeTimeout, never the stores of other namespaces.
const Workers = 4

// StoreReconciler checks the stores of one kind (BackupStore, or
// ClusterBackupStore when Cluster is set): a probe object written, read
// back and deleted for an object store, the claim bound for a volume;
// Ready says so.
type StoreReconciler struct {
	Deps
	// Cluster: the ClusterBackupStores, not the BackupStores.
	Cluster bool
}

// SetupWithManager builds the controller.
func (r *StoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	var obj client.Object = &v1alpha1.BackupStore{}
	name := "backupstore"
	if r.Cluster {
		obj, name = &v1alpha1.ClusterBackupStore{}, "clusterbackupstore"
	}
	// Its own status writes (lastChecked) do not check it again: a new
	// spec does, and Recheck.
	return ctrl.NewControllerManagedBy(mgr).Named(name).For(obj, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(options(r.SkipNameValidation)).Complete(r)
}

// Reconcile checks one store and writes its Ready condition.
func (r *StoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var (
		obj      client.Object
		spec     v1alpha1.BackupStoreSpec
		status   *v1alpha1.BackupStoreStatus
		secretNS = req.Namespace
	)
	if r.Cluster {
		s := &v1alpha1.ClusterBackupStore{}
		if err := r.Client.Get(ctx, req.NamespacedName, s); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		obj, status = s, &s.Status
		spec = v1alpha1.BackupStoreSpec{S3: s.Spec.S3, GCS: s.Spec.GCS, Azure: s.Spec.Azure, Volume: s.Spec.Volume}
		secretNS = ""
	} else {
		s := &v1alpha1.BackupStore{}
		if err := r.Client.Get(ctx, req.NamespacedName, s); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		obj, status, spec = s, &s.Status, s.Spec
	}
	before := status.DeepCopy()
	reason, msg := r.check(ctx, obj, spec, secretNS)
	if reason == reasonBusy {
		// Nothing was checked: the status stays as it is.
		return ctrl.Result{RequeueAfter: busyRecheck()}, nil
	}
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: obj.GetGeneration()}
	if reason != "Checked" {
		cond.Status = metav1.ConditionFalse
	}
	prev := apimeta.FindStatusCondition(status.Conditions, v1alpha1.ConditionReady)
	if prev == nil || prev.Status != cond.Status || prev.Reason != cond.Reason || prev.Message != cond.Message {
		kind := corev1.EventTypeNormal
		if cond.Status != metav1.ConditionTrue {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Event(obj, kind, "Store"+reason, msg)
	}
	apimeta.SetStatusCondition(&status.Conditions, cond)
	status.ObservedGeneration = obj.GetGeneration()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	status.LastChecked = &now
	patch := client.MergeFrom(withStatus(obj, before))
	if err := r.Client.Status().Patch(ctx, obj, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("writing status: %w", err)
	}
	if reason == "ClaimNotFound" || reason == "ClaimNotBound" {
		// A claim created beside its store is usually there and bound
		// within seconds: look again soon (one read of the claim).
		return ctrl.Result{RequeueAfter: claimRecheck(obj.GetCreationTimestamp().Time)}, nil
	}
	return ctrl.Result{RequeueAfter: Recheck}, nil
}

// withStatus is a copy of obj with status st (the patch's base).
func withStatus(obj client.Object, st *v1alpha1.BackupStoreStatus) client.Object {
	switch o := obj.(type) {
	case *v1alpha1.BackupStore:
		c := o.DeepCopy()
		c.Status = *st
		return c
	case *v1alpha1.ClusterBackupStore:
		c := o.DeepCopy()
		c.Status = *st
		return c
	}
	return obj
}

// check returns "Checked" and what was done, or the reason the store
// cannot be used and how to fix it. Messages never hold credentials.
func (r *StoreReconciler) check(ctx context.Context, obj client.Object, spec v1alpha1.BackupStoreSpec, secretNS string) (string, string) {
	if spec.Volume != nil {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		ns := obj.GetNamespace()
		if r.Cluster {
			return "Checked", "a volume store is checked by each backup Job, which mounts claim " + spec.Volume.ClaimName + " in its own namespace"
		}
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: spec.Volume.ClaimName}, pvc); err != nil {
			if apierrors.IsNotFound(err) {
				return "ClaimNotFound", fmt.Sprintf("spec.volume.claimName: PersistentVolumeClaim %s/%s does not exist: create it or name another", ns, spec.Volume.ClaimName)
			}
			return "ClaimUnreadable", "reading the claim: " + redact.Error(err).Error()
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return "ClaimNotBound", fmt.Sprintf("spec.volume.claimName: PersistentVolumeClaim %s/%s is %s, not Bound", ns, spec.Volume.ClaimName, pvc.Status.Phase)
		}
		return "Checked", fmt.Sprintf("PersistentVolumeClaim %s is bound", spec.Volume.ClaimName)
	}
	if g := spec.GCS; g != nil {
		if !r.Cluster && g.Endpoint != "" && !backup.EndpointAllowed(g.Endpoint, r.Endpoints) {
			return "EndpointNotAllowed", fmt.Sprintf("spec.gcs.endpoint %q is not within one of the endpoints the operator allows namespaced stores (same scheme, host and port; a path at or below theirs; --backup-store-endpoints: %s): use an allowed endpoint, or ask an admin for a ClusterBackupStore", g.Endpoint, strings.Join(orNone(r.Endpoints), ", "))
		}
		secretNS := obj.GetNamespace()
		if r.Cluster && g.CredentialsSecretRef != nil {
			secretNS = g.CredentialsSecretRef.Namespace
		}
		cfg, reason, msg := gcsConfig(ctx, r.Reader, g, secretNS, r.Cluster, r.Endpoints)
		if cfg == nil {
			return reason, msg
		}
		if reason, msg := r.probe(ctx, obj.GetNamespace(), backup.StoreRequest{GCS: cfg}); reason != "" {
			return reason, msg
		}
		return "Checked", fmt.Sprintf("a probe object was written to bucket %s, read back and deleted", g.Bucket)
	}
	if az := spec.Azure; az != nil {
		if !r.Cluster && az.Endpoint != "" && !backup.EndpointAllowed(az.Endpoint, r.Endpoints) {
			return "EndpointNotAllowed", fmt.Sprintf("spec.azure.endpoint %q is not within one of the endpoints the operator allows namespaced stores (same scheme, host and port; a path at or below theirs; --backup-store-endpoints: %s): use an allowed endpoint, or ask an admin for a ClusterBackupStore", az.Endpoint, strings.Join(orNone(r.Endpoints), ", "))
		}
		secretNS := obj.GetNamespace()
		if r.Cluster {
			secretNS = az.CredentialsSecretRef.Namespace
		}
		cfg, reason, msg := azureConfig(ctx, r.Reader, az, secretNS)
		if cfg == nil {
			return reason, msg
		}
		if reason, msg := r.probe(ctx, obj.GetNamespace(), backup.StoreRequest{Azure: cfg}); reason != "" {
			return reason, msg
		}
		return "Checked", fmt.Sprintf("a probe object was written to container %s, read back and deleted", az.Container)
	}
	s3 := spec.S3
	if s3 == nil {
		return "Invalid", "set exactly one of spec.s3, spec.gcs, spec.azure or spec.volume"
	}
	if !r.Cluster && s3.Endpoint != "" && !backup.EndpointAllowed(s3.Endpoint, r.Endpoints) {
		return "EndpointNotAllowed", fmt.Sprintf("spec.s3.endpoint %q is not within one of the endpoints the operator allows namespaced stores (same scheme, host and port; a path at or below theirs; --backup-store-endpoints: %s): use an allowed endpoint, or ask an admin for a ClusterBackupStore", s3.Endpoint, strings.Join(orNone(r.Endpoints), ", "))
	}
	secretNS, caNS := obj.GetNamespace(), obj.GetNamespace()
	if r.Cluster {
		secretNS = s3.CredentialsSecretRef.Namespace
		if s3.CASecretRef != nil {
			caNS = s3.CASecretRef.Namespace
		}
	}
	cfg, reason, msg := s3Config(ctx, r.Reader, s3, secretNS, caNS)
	if cfg == nil {
		return reason, msg
	}
	if reason, msg := r.probe(ctx, obj.GetNamespace(), backup.StoreRequest{S3: cfg}); reason != "" {
		return reason, msg
	}
	return "Checked", fmt.Sprintf("a probe object was written to bucket %s, read back and deleted", s3.Bucket)
}

// probe has the store helper write, read back and delete a probe object;
// the reason and message when that fails.
func (r *StoreReconciler) probe(ctx context.Context, namespace string, req backup.StoreRequest) (string, string) {
	req.Op = "probe"
	reply, err := r.Stores.Do(ctx, helperNamespace(r.Cluster, namespace), req)
	switch {
	case errors.Is(err, backup.ErrBusy):
		return reasonBusy, ""
	case err != nil:
		return "HelperFailed", "the store could not be checked: " + err.Error()
	case reply.Invalid != "":
		return "Invalid", reply.Invalid
	case reply.Failed != "":
		return "ProbeFailed", "writing, reading and deleting a probe object failed: " + reply.Failed
	}
	return "", ""
}

// s3Config is the store of s3 with the credentials (and CAs) of its
// Secrets in secretNS (caNS); nil and the reason and message (never a
// secret) when they cannot be read.
func s3Config(ctx context.Context, reader client.Reader, s3 *v1alpha1.S3Store, secretNS, caNS string) (*backup.S3, string, string) {
	ref := s3.CredentialsSecretRef
	cfg := &backup.S3{Endpoint: s3.Endpoint, Bucket: s3.Bucket, Prefix: s3.Prefix, Region: s3.Region, ForcePathStyle: s3.ForcePathStyle}
	sec := &corev1.Secret{}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: secretNS, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "CredentialsNotFound", fmt.Sprintf("spec.s3.credentialsSecretRef: Secret %s/%s does not exist: create it with keys accessKeyID and secretAccessKey", secretNS, ref.Name)
		}
		return nil, "CredentialsUnreadable", "reading the credentials Secret: " + redact.Error(err).Error()
	}
	cfg.AccessKeyID, cfg.SecretAccessKey = string(sec.Data["accessKeyID"]), string(sec.Data["secretAccessKey"])
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, "CredentialsIncomplete", fmt.Sprintf("spec.s3.credentialsSecretRef: Secret %s/%s needs both keys accessKeyID and secretAccessKey", secretNS, ref.Name)
	}
	if ca := s3.CASecretRef; ca != nil {
		cs := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: caNS, Name: ca.Name}, cs); err != nil || len(cs.Data[ca.Key]) == 0 {
			return nil, "CANotFound", fmt.Sprintf("spec.s3.caSecretRef: Secret %s/%s has no key %s", caNS, ca.Name, ca.Key)
		}
		cfg.CABundle = cs.Data[ca.Key]
	}
	return cfg, "", ""
}

// azureConfig is the container of az with the account key of its Secret
// in secretNS; nil and the reason and message (never the key) when it
// cannot be read.
func azureConfig(ctx context.Context, reader client.Reader, az *v1alpha1.AzureStore, secretNS string) (*backup.Azure, string, string) {
	ref := az.CredentialsSecretRef
	sec := &corev1.Secret{}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: secretNS, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "CredentialsNotFound", fmt.Sprintf("spec.azure.credentialsSecretRef: Secret %s/%s does not exist: create it with key accountKey", secretNS, ref.Name)
		}
		return nil, "CredentialsUnreadable", "reading the credentials Secret: " + redact.Error(err).Error()
	}
	key := string(sec.Data["accountKey"])
	if key == "" {
		return nil, "CredentialsIncomplete", fmt.Sprintf("spec.azure.credentialsSecretRef: Secret %s/%s needs key accountKey", secretNS, ref.Name)
	}
	return &backup.Azure{Endpoint: az.Endpoint, AccountName: az.AccountName, Container: az.Container, Prefix: az.Prefix, AccountKey: key}, "", ""
}

// gcsConfig is the bucket of g with the service account key of its Secret
// in secretNS (none against an emulator's endpoint); nil and the reason
// and message (never the key) when it cannot be read.
//
// The key's token_uri is where the helper sends the key's signed request:
// Google's, else within tokenURLs (a namespaced store: the endpoints the
// admin allows); a cluster store (the admin's own) passes nil for any.
func gcsConfig(ctx context.Context, reader client.Reader, g *v1alpha1.GCSStore, secretNS string, cluster bool, tokenURLs []string) (*backup.GCS, string, string) {
	key := ""
	if ref := g.CredentialsSecretRef; ref != nil {
		sec := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: secretNS, Name: ref.Name}, sec); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, "CredentialsNotFound", fmt.Sprintf("spec.gcs.credentialsSecretRef: Secret %s/%s does not exist: create it with key serviceAccountKey", secretNS, ref.Name)
			}
			return nil, "CredentialsUnreadable", "reading the credentials Secret: " + redact.Error(err).Error()
		}
		key = string(sec.Data["serviceAccountKey"])
		if key == "" {
			return nil, "CredentialsIncomplete", fmt.Sprintf("spec.gcs.credentialsSecretRef: Secret %s/%s needs key serviceAccountKey (a service account's JSON key)", secretNS, ref.Name)
		}
	}
	cfg := &backup.GCS{Endpoint: g.Endpoint, Bucket: g.Bucket, Prefix: g.Prefix, ServiceAccountKey: key, AllowedTokenURLs: tokenURLs}
	if key != "" {
		k, err := backup.ParseGCSKey(key)
		if err != nil {
			return nil, "InvalidCredentials", fmt.Sprintf("spec.gcs.credentialsSecretRef: Secret %s/%s key serviceAccountKey: %s", secretNS, g.CredentialsSecretRef.Name, err)
		}
		if cluster {
			cfg.AllowedTokenURLs = []string{k.TokenURL()}
		}
		if err := cfg.Validate(); err != nil {
			return nil, "InvalidCredentials", fmt.Sprintf("spec.gcs.credentialsSecretRef: Secret %s/%s key serviceAccountKey: %s (--backup-store-endpoints: %s)", secretNS, g.CredentialsSecretRef.Name, err, strings.Join(orNone(tokenURLs), ", "))
		}
	}
	return cfg, "", ""
}

// storeRequest is the helper's request for a remote store (S3, GCS or
// Azure) of spec with the Secrets of secretNS; why not when they cannot be
// read, or when spec is a volume.
func storeRequest(ctx context.Context, reader client.Reader, spec v1alpha1.BackupStoreSpec, secretNS string, cluster bool, endpoints []string) (backup.StoreRequest, string) {
	// The endpoints a tenant's store may name are checked at every request,
	// not only when the store was checked: the allowed list may have
	// changed since (the manager restarted with another).
	if !cluster {
		for field, e := range map[string]string{"spec.s3.endpoint": s3Endpoint(spec), "spec.azure.endpoint": azureEndpoint(spec), "spec.gcs.endpoint": gcsEndpoint(spec)} {
			if e != "" && !backup.EndpointAllowed(e, endpoints) {
				return backup.StoreRequest{}, fmt.Sprintf("%s %q is not among the endpoints the operator allows (--backup-store-endpoints: %s)", field, e, strings.Join(orNone(endpoints), ", "))
			}
		}
	}
	switch {
	case spec.S3 != nil:
		cfg, _, msg := s3Config(ctx, reader, spec.S3, secretNS, secretNS)
		return backup.StoreRequest{S3: cfg}, msg
	case spec.Azure != nil:
		cfg, _, msg := azureConfig(ctx, reader, spec.Azure, secretNS)
		return backup.StoreRequest{Azure: cfg}, msg
	case spec.GCS != nil:
		cfg, _, msg := gcsConfig(ctx, reader, spec.GCS, secretNS, cluster, endpoints)
		return backup.StoreRequest{GCS: cfg}, msg
	}
	return backup.StoreRequest{}, "a volume store cannot be read by the operator"
}

func orNone(s []string) []string {
	if len(s) == 0 {
		return []string{"none"}
	}
	return s
}

func s3Endpoint(spec v1alpha1.BackupStoreSpec) string {
	if spec.S3 != nil {
		return spec.S3.Endpoint
	}
	return ""
}

func azureEndpoint(spec v1alpha1.BackupStoreSpec) string {
	if spec.Azure != nil {
		return spec.Azure.Endpoint
	}
	return ""
}

func gcsEndpoint(spec v1alpha1.BackupStoreSpec) string {
	if spec.GCS != nil {
		return spec.GCS.Endpoint
	}
	return ""
}
