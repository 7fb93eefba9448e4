// Package datadisk makes a machine's data disks: empty qcow2 volumes, one
// per spec.dataDisks entry, created with the machine and deleted with it.
// Each volume's name derives from the machine's domain and the disk's
// name (naming.DataDiskVolumeName), so deletion, quotas and sweeps find
// it without the spec.
package datadisk

import (
	"context"
	"errors"
	"fmt"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// recheckPool is how often a machine whose data disk's pool is missing
// looks again: an operator creates it, nothing announces it.
const recheckPool = time.Minute

// Service makes the data disks; its outcome is DiskReady's (after the
// root disk's).
type Service struct {
	vm   *scope.VM
	host virt.StorageHost
	// volumes are what the last Reconcile ensured.
	volumes []virt.VolumeInfo
}

var _ services.Service = (*Service)(nil)

// New returns the data disk service of vm.
func New(vm *scope.VM, host virt.StorageHost) *Service { return &Service{vm: vm, host: host} }

func (*Service) Name() string { return "data disks" }

// Volumes are the data disks' volumes, in the VM's DataDisks order, which
// the last Reconcile ensured and the domain step attaches; nil when it did
// not run or stopped.
func (svc *Service) Volumes() []virt.VolumeInfo { return svc.volumes }

// Reconcile ensures every data disk's volume and hands them, in order, to
// the domain step of the same reconcile.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.volumes = nil
	volumes := make([]virt.VolumeInfo, 0, len(vm.DataDisks))
	for _, d := range vm.DataDisks {
		name := vm.DataDiskVolume(d.Name)
		info, err := svc.host.EnsureDataVolume(ctx, d.Pool, name, d.SizeBytes)
		switch {
		case err == nil:
		case errors.Is(err, virt.ErrPoolFull):
			return services.Result{}, services.Fail(infrav1.PoolFullReason, services.Requeue(recheckPool, "pool full"),
				"Creating data disk %s in pool %s: %v", d.Name, d.Pool, err)
		case virt.IsNotFound(err):
			return services.Result{}, services.Fail(infrav1.StoragePoolNotFoundReason, services.Requeue(recheckPool, "pool missing"),
				"Data disk %s: storage pool %s does not exist on the machine's libvirt host", d.Name, d.Pool)
		default:
			return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Creating data disk %s: %v", d.Name, err)
		}
		volumes = append(volumes, info)
	}
	svc.volumes = volumes
	if len(volumes) == 0 {
		return services.Done(infrav1.ReadyReason, ""), nil
	}
	return services.Done(infrav1.ReadyReason, fmt.Sprintf("Root disk and %d data disks", len(volumes))), nil
}

// Delete removes every data disk's volume; a missing one or pool is
// success.
func (svc *Service) Delete(ctx context.Context) error {
	var errs []error
	for _, d := range svc.vm.DataDisks {
		if err := svc.host.DeleteVolume(ctx, d.Pool, svc.vm.DataDiskVolume(d.Name)); err != nil {
			errs = append(errs, fmt.Errorf("deleting data disk %s: %w", d.Name, err))
		}
	}
	return errors.Join(errs...)
}
