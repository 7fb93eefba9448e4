package scope

import (
	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// vmVolumes carries a VM's root disk and seed from the disk and seed
// steps to the domain step of the same reconcile, which attaches them, so
// that neither is looked up again. It lives as long as the scope: one
// reconcile.
type vmVolumes struct {
	rootDisk, seed *virt.VolumeInfo
}

// SetRootDisk records the root disk the disk step ensured.
func (v *vmVolumes) SetRootDisk(info virt.VolumeInfo) { v.rootDisk = &info }

// RootDisk is the root disk the disk step ensured in this reconcile;
// false when it did not run (a provisioned VM skips it).
func (v *vmVolumes) RootDisk() (virt.VolumeInfo, bool) {
	if v.rootDisk == nil {
		return virt.VolumeInfo{}, false
	}
	return *v.rootDisk, true
}

// SetSeed records the seed volume the seed step ensured.
func (v *vmVolumes) SetSeed(info virt.VolumeInfo) { v.seed = &info }

// Seed is the seed volume the seed step ensured in this reconcile; false
// when it did not run.
func (v *vmVolumes) Seed() (virt.VolumeInfo, bool) {
	if v.seed == nil {
		return virt.VolumeInfo{}, false
	}
	return *v.seed, true
}

// Image is the machine's base image.
func (s *MachineScope) Image() infrav1.ImageSource { return s.LibvirtMachine.Spec.Image }

// defaultHardware is hw with the API's defaults applied (the same the
// webhooks write, for objects stored before they ran), and without a TCG
// cache size when the domain does not run under TCG, where it means nothing.
func defaultHardware(hw infrav1.VirtualHardware, cpus, memoryMiB int32) infrav1.VirtualHardware {
	hw.Default(cpus, memoryMiB)
	if hw.DomainType != infrav1.DomainTypeQEMU {
		hw.TCGTranslationCacheMiB = 0
	}
	return hw
}

// ClusterPool is the storage pool of a LibvirtCluster's spec, defaults
// applied; lc may be nil. Path is empty when a pool is named without one:
// it must then exist already.
func ClusterPool(lc *infrav1.LibvirtCluster) virt.PoolSpec {
	spec := virt.PoolSpec{Name: infrav1.DefaultStoragePoolName, Path: infrav1.DefaultStoragePoolPath}
	if lc == nil {
		return spec
	}
	p := lc.Spec.StoragePool
	if p.Name != "" {
		spec = virt.PoolSpec{Name: p.Name}
	}
	if p.Path != "" {
		spec.Path = p.Path
	}
	return spec
}

// recordedPool is spec, unless annotations record that the object's
// volumes went into another pool (the spec changed since): that pool,
// which must exist.
func recordedPool(spec virt.PoolSpec, annotations map[string]string) virt.PoolSpec {
	if recorded := annotations[PoolAnnotation]; recorded != "" && recorded != spec.Name {
		return virt.PoolSpec{Name: recorded}
	}
	return spec
}
