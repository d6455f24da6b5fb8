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
	stores := data.NewStoreHelper(helperPath)
	for _, cluster := range []bool{false, true} {
		kind := "BackupStore"
		if cluster {
			kind = "ClusterBackupStore"
		}
		if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: kind}, v1alpha1.GroupVersion.Version); err != nil {
			o.Log.WithName("setup").Info("CRD not installed: no backup stores of this kind are checked", "kind", kind)
			continue
		}
		r := &backup.StoreReconciler{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("chartpilot-backupstore"),
			Cluster: cluster, Endpoints: o.BackupStoreEndpoints, SkipNameValidation: o.SeveralInProcess, Stores: stores,
		}
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "Backup"}, v1alpha1.GroupVersion.Version); err != nil {
		o.Log.WithName("setup").Info("CRD not installed: no Backups are run", "kind", "Backup")
		return nil
	}
	b := &backup.BackupReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("chartpilot-backup"),
		Image: o.BackupImage, PostgresImage: o.PostgresImage, SkipNameValidation: o.SeveralInProcess, Kinds: backup.KindsOf(o.Watches), Identity: identity,
		Stores: stores, Endpoints: o.BackupStoreEndpoints,
	}
	if err := b.SetupWithManager(mgr); err != nil {
		return err
	}
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "Postgres"}, v1alpha1.GroupVersion.Version); err != nil {
		return nil
	}
	s := &backup.ScheduleReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("chartpilot-backup"),
		Image: o.BackupImage, PostgresImage: o.PostgresImage, SkipNameValidation: o.SeveralInProcess, Identity: identity}
	if err := s.SetupWithManager(mgr); err != nil {
		return err
	}
	rs := &backup.RestoreReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("chartpilot-backup"),
		Image: o.BackupImage, PostgresImage: o.PostgresImage, SkipNameValidation: o.SeveralInProcess, Identity: identity}
	return rs.SetupWithManager(mgr)
}
