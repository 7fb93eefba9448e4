package scope

import (
	"context"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// VM is what the per-resource services (address, disk, seed, domain) need
// of the object whose virtual machine they build: a LibvirtMachine
// (MachineScope) or a LibvirtCluster's HAProxy VM (LoadBalancerScope). The
// services set the LibvirtMachine step conditions through it; a scope
// without those conditions maps them onto its own.
type VM interface {
	// LibvirtHost is the libvirt host the VM lives on.
	LibvirtHost() virt.Host

	// DomainName, DomainUUID, OverlayVolume, SeedVolume and Hostname are
	// the VM's derived identity; Owner goes into the domain's metadata.
	DomainName() string
	DomainUUID() string
	OverlayVolume() string
	SeedVolume() string
	Hostname() string
	Owner() virt.Owner
	// MACSeed is what the VM's candidate MACs derive from (MACCandidates).
	MACSeed() string

	// Pool, Network, Hardware, DiskSizeBytes and Image shape the VM.
	Pool() virt.PoolSpec
	Network() NetworkRef
	Hardware() infrav1.VirtualHardware
	DiskSizeBytes() uint64
	Image() infrav1.ImageSource

	// MAC is the NIC's MAC once chosen; SetMAC and RecordPlacement record
	// it and where the VM's objects go, and PatchObject persists them
	// before anything is created in libvirt.
	MAC() string
	SetMAC(mac string)
	RecordPlacement()
	PatchObject(ctx context.Context) error
	// SetDomainState records libvirt's state of the domain; SetProviderID
	// records the provider ID, where the object has one.
	SetDomainState(state string)
	SetProviderID()
	// IsProvisioned tells whether a vanished or dead domain is a terminal
	// failure (a bootstrapped machine) rather than something to recreate.
	IsProvisioned() bool

	// IsTrue, MarkTrue and MarkFalse read and set a step condition
	// (infrav1.*Condition of LibvirtMachine); Event records an event.
	IsTrue(condType string) bool
	MarkTrue(condType, reason, message string)
	MarkFalse(condType, reason, format string, args ...any)
	Event(eventType, reason, message string)
}

var _ VM = (*MachineScope)(nil)

// LibvirtHost is the machine's libvirt host.
func (s *MachineScope) LibvirtHost() virt.Host { return s.Host }

// MACSeed is the LibvirtMachine's UID.
func (s *MachineScope) MACSeed() string { return string(s.LibvirtMachine.UID) }

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
