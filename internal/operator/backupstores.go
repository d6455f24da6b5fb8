package operator

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/chartpilot/chartpilot/internal/api/v1alpha1"
	data "github.com/chartpilot/chartpilot/internal/backup"
	"github.com/chartpilot/chartpilot/internal/controller/backup"
)

// addBackupStores adds the controllers that check BackupStores and
// ClusterBackupStores and run Backups, when their CRDs are installed
// (config/crd).
func addBackupStores(o Options, mgr manager.Manager, identity *backup.Identity) error {
	helperPath := o.StoreHelper
	if helperPath == "" {
		helperPath = data.DefaultHelperPath()
	}
	deps := backup.Deps{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("chartpilot-backup"), Identity: identity,
		Image: o.BackupImage, PostgresImage: o.PostgresImage, Stores: data.NewStoreHelper(helperPath), Endpoints: o.BackupStoreEndpoints,
		SkipNameValidation: o.SeveralInProcess,
	}
	storeDeps := deps
	storeDeps.Recorder = mgr.GetEventRecorderFor("chartpilot-backupstore")
	for _, cluster := range []bool{false, true} {
		kind := "BackupStore"
		if cluster {
			kind = "ClusterBackupStore"
		}
		if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: kind}, v1alpha1.GroupVersion.Version); err != nil {
			o.Log.WithName("setup").Info("CRD not installed: no backup stores of this kind are checked", "kind", kind)
			continue
		}
		r := &backup.StoreReconciler{Deps: storeDeps, Cluster: cluster}
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "Backup"}, v1alpha1.GroupVersion.Version); err != nil {
		o.Log.WithName("setup").Info("CRD not installed: no Backups are run", "kind", "Backup")
		return nil
	}
	b := &backup.BackupReconciler{Deps: deps, Kinds: backup.KindsOf(o.Watches)}
	if err := b.SetupWithManager(mgr); err != nil {
		return err
	}
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "Postgres"}, v1alpha1.GroupVersion.Version); err != nil {
		return nil
	}
	if err := (&backup.ScheduleReconciler{Deps: deps}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&backup.RestoreReconciler{Deps: deps}).SetupWithManager(mgr)
}
