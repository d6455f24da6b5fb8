package backup

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/chartpilot/chartpilot/internal/agentargs"
	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	"github.com/chartpilot/chartpilot/internal/hooks"
	"github.com/chartpilot/chartpilot/internal/jobspec"
)

// reasonRecovery is the reason of the hook's condition while
// spec.bootstrap.recovery cannot be carried out as written.
const reasonRecovery = "RecoveryUnusable"

// recoveryValues is the values layer of spec.bootstrap.recovery: the
// chart's bootstrap.recovery values, which give pod 0 an init container
// that recovers the first data from the archive. The store is resolved
// as the archive's is; its credentials reach the pod only as references.
// Once status.recovery is Completed, a store that can no longer be
// resolved drops the layer (pod 0 skips the recovery from then on anyway)
// instead of holding the release.
func (a *Archive) recoveryValues(ctx context.Context, obj hooks.Object) (map[string]any, error) {
	pg, err := a.postgresOf(obj)
	if pg == nil || err != nil {
		return nil, err
	}
	if pg.Spec.Bootstrap == nil || pg.Spec.Bootstrap.Recovery == nil {
		return nil, nil
	}
	// Checked whatever became of the recovery: the recovered server never
	// archives into the archive it was made from.
	if prefix := ownArchive(pg); prefix != "" {
		return nil, hooks.Reject(reasonRecovery, "spec.bootstrap.recovery: the archive to recover from, %s, is the one this Postgres would archive to: set spec.backup.walArchive.prefix to a prefix no server archived to", prefix)
	}
	done := pg.Status.Recovery != nil && pg.Status.Recovery.Phase == v1alpha1.RecoveryCompleted
	v, err := a.recoveryLayer(ctx, pg)
	if err != nil && done {
		return nil, nil
	}
	return v, err
}

func (a *Archive) recoveryLayer(ctx context.Context, pg *v1alpha1.Postgres) (map[string]any, error) {
	rec := pg.Spec.Bootstrap.Recovery
	if !failoverOn(pg) {
		return nil, hooks.Reject(reasonRecovery, "spec.bootstrap.recovery needs the instance manager, which leads with the recovered data: set spec.failover.enabled: true (or replicas of 2 or more)")
	}
	ref, field := rec.Store, "spec.bootstrap.recovery.store"
	if ref == nil && pg.Spec.Backup != nil {
		ref, field = &pg.Spec.Backup.Store, "spec.backup.store"
	}
	if ref == nil || ref.Name == "" {
		return nil, hooks.Reject(reasonRecovery, "spec.bootstrap.recovery.store: name the store that holds the archive (or set spec.backup.store)")
	}
	st, err := a.storeFor(ctx, pg, *ref, "spec.bootstrap.recovery", field, reasonRecovery)
	if err != nil {
		return nil, err
	}
	prefix, err := recoveryPrefix(pg, st, ref.Name)
	if err != nil {
		return nil, hooks.Reject(reasonRecovery, "%s", err.Error())
	}
	store, env, _, _ := jobspec.StoreFlags(st.spec)
	enc := rec.Encryption
	if enc == nil && pg.Spec.Backup != nil {
		enc = pg.Spec.Backup.Encryption
	}
	if enc != nil {
		env = append(env, corev1.EnvVar{Name: agentargs.EnvAgeKey, ValueFrom: secretKey(enc.KeySecretRef.Name, enc.KeySecretRef.Key)})
	}
	words, err := archiveWords(ref.Name, store.Args())
	if err != nil {
		return nil, hooks.Reject(reasonRecovery, "%s", strings.Replace(err.Error(), "spec.backup.walArchive", "spec.bootstrap.recovery", 1))
	}
	secretEnv := make([]any, 0, len(env))
	for _, e := range env {
		r := e.ValueFrom.SecretKeyRef
		secretEnv = append(secretEnv, map[string]any{"name": e.Name, "secretName": r.Name, "key": r.Key})
	}
	r := map[string]any{"enabled": true, "prefix": prefix, "storeArgs": words, "secretEnv": secretEnv,
		"targetTime": rec.TargetTime, "targetLSN": rec.TargetLSN, "targetXID": rec.TargetXID}
	if s3 := st.spec.S3; s3 != nil && s3.CASecretRef != nil {
		r["ca"] = map[string]any{"secretName": s3.CASecretRef.Name, "key": s3.CASecretRef.Key}
	}
	return map[string]any{"bootstrap": map[string]any{"recovery": r}}, nil
}

// recoveryPrefix is the archive a recovery reads: spec.bootstrap.recovery's
// prefix (default NAMESPACE/SOURCE), then pgMAJOR of spec.version. A
// ClusterBackupStore is read below the namespace's own name only, as it
// is written.
func recoveryPrefix(pg *v1alpha1.Postgres, st *resolvedStore, store string) (string, error) {
	rec := pg.Spec.Bootstrap.Recovery
	if st.spec.Volume != nil {
		return "", fmt.Errorf("spec.bootstrap.recovery: store %s is a volume, which the server's pods do not mount; a WAL archive is in an s3, gcs or azure store", store)
	}
	prefix := rec.Prefix
	def := pg.Namespace + "/" + rec.Source
	if prefix == "" {
		prefix = def
	}
	if err := confinedPrefix("spec.bootstrap.recovery.prefix", prefix, def, pg.Namespace, store, st.cluster); err != nil {
		return "", err
	}
	return prefix + "/pg" + majorOf(pg.Spec.Version), nil
}

// failoverOn reports whether pg's pods run the instance manager: as the
// Postgres kind decides it (spec.failover.enabled, else replicas of 2 or
// more).
func failoverOn(pg *v1alpha1.Postgres) bool {
	if f := pg.Spec.Failover; f != nil && f.Enabled != nil {
		return *f.Enabled
	}
	return pg.Spec.Replicas != nil && *pg.Spec.Replicas > 1
}

// ownArchive is the archive pg would both recover from and archive to (the
// same store, the same prefix), "" when they differ.
func ownArchive(pg *v1alpha1.Postgres) string {
	rec, sb := pg.Spec.Bootstrap.Recovery, pg.Spec.Backup
	if sb == nil || sb.WALArchive == nil {
		return ""
	}
	ref := sb.Store
	if rec.Store != nil {
		ref = *rec.Store
	}
	kind := func(k string) string {
		if k == "" {
			return "BackupStore"
		}
		return k
	}
	if ref.Name != sb.Store.Name || kind(ref.Kind) != kind(sb.Store.Kind) {
		return ""
	}
	from := rec.Prefix
	if from == "" {
		from = pg.Namespace + "/" + rec.Source
	}
	to := sb.WALArchive.Prefix
	if to == "" {
		to = pg.Namespace + "/" + pg.Name
	}
	if strings.Trim(from, "/") != strings.Trim(to, "/") {
		return ""
	}
	return from + "/pg" + majorOf(pg.Spec.Version)
}
