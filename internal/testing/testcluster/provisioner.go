package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

// ProvisionerName is the provisioner of the default StorageClass.
const ProvisionerName = "chartpilot.dev/local-hostpath"

// hostPathProvisioner provisions hostPath volumes under a directory of the
// cluster. No kubelet ever mounts them (kwok runs the pods), but the path is
// real, so a test can see what a volume would hold.
type hostPathProvisioner struct {
	root string
}

var _ controller.Provisioner = (*hostPathProvisioner)(nil)

// Provision creates the volume's directory and returns a bound-able PV.
func (p *hostPathProvisioner) Provision(_ context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	path := filepath.Join(p.root, opts.PVName)
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("creating volume directory: %w", err)
	}
	// Writable by any user, as local-path provisioners make them: a
	// hostPath volume gets no fsGroup, and real nodes' pods run as non-root.
	if err := os.Chmod(path, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("creating volume directory: %w", err)
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if opts.StorageClass.ReclaimPolicy != nil {
		reclaim = *opts.StorageClass.ReclaimPolicy
	}
	hostPathType := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   opts.PVC.Spec.AccessModes,
			VolumeMode:                    opts.PVC.Spec.VolumeMode,
			Capacity: corev1.ResourceList{
				corev1.ResourceStorage: opts.PVC.Spec.Resources.Requests[corev1.ResourceStorage],
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &hostPathType},
			},
			MountOptions: opts.StorageClass.MountOptions,
		},
	}
	return pv, controller.ProvisioningFinished, nil
}

// Delete removes the volume's directory.
func (p *hostPathProvisioner) Delete(_ context.Context, pv *corev1.PersistentVolume) error {
	if pv.Spec.HostPath == nil {
		return &controller.IgnoredError{Reason: "not a hostPath volume"}
	}
	path := filepath.Clean(pv.Spec.HostPath.Path)
	if filepath.Dir(path) != filepath.Clean(p.root) {
		return &controller.IgnoredError{Reason: "volume is not under this provisioner's root"}
	}
	return os.RemoveAll(path)
}

func (c *Cluster) startProvisioner(ctx context.Context, cs kubernetes.Interface) error {
	root := filepath.Join(c.Dir, "volumes")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	expand := true
	binding := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        DefaultStorageClass,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:          ProvisionerName,
		AllowVolumeExpansion: &expand,
		VolumeBindingMode:    &binding,
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating StorageClass %s: %w", DefaultStorageClass, err)
	}
	logger := klog.NewKlogr().WithName("provisioner")
	pctx := klog.NewContext(ctx, logger)
	pc := controller.NewProvisionController(pctx, cs, ProvisionerName, &hostPathProvisioner{root: root},
		controller.LeaderElection(false),
		controller.Threadiness(4),
		controller.ResyncPeriod(30*time.Second),
	)
	c.bg.Add(2)
	go func() {
		defer c.bg.Done()
		pc.Run(pctx)
	}()
	go func() {
		defer c.bg.Done()
		runResizer(ctx, cs)
	}()
	return nil
}

// runResizer completes volume expansion for the default StorageClass, as an
// external resizer would: when a bound claim asks for more than it has, the
// PV's capacity and then the claim's status capacity are raised. A poll every
// two seconds is plenty for tests and costs one list per period.
func runResizer(ctx context.Context, cs kubernetes.Interface) {
	_ = wait.PollUntilContextCancel(ctx, 2*time.Second, false, func(ctx context.Context) (bool, error) {
		pvcs, err := cs.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // try again next period
		}
		for i := range pvcs.Items {
			resizeClaim(ctx, cs, &pvcs.Items[i])
		}
		return false, nil
	})
}

func resizeClaim(ctx context.Context, cs kubernetes.Interface, pvc *corev1.PersistentVolumeClaim) {
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return
	}
	want := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	have := pvc.Status.Capacity[corev1.ResourceStorage]
	if want.Cmp(have) <= 0 {
		return
	}
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.StorageClassName != DefaultStorageClass {
		return
	}
	pvCap := pv.Spec.Capacity[corev1.ResourceStorage]
	if pvCap.Cmp(want) < 0 {
		pv.Spec.Capacity[corev1.ResourceStorage] = want.DeepCopy()
		if _, err := cs.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return
		}
	}
	if pvc.Status.Capacity == nil {
		pvc.Status.Capacity = corev1.ResourceList{}
	}
	pvc.Status.Capacity[corev1.ResourceStorage] = want.DeepCopy()
	pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: want.DeepCopy()}
	pvc.Status.Conditions = nil
	_, _ = cs.CoreV1().PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
}

func resourceMust(s string) resource.Quantity { return resource.MustParse(s) }
