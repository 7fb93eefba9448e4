package scope

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// VM is one virtual machine as the machine services (identity, address,
// disk, data disk, seed, domain, guest) build and watch it: a LibvirtMachine's, or a
// LibvirtCluster's HAProxy VM. Its object's scope builds it from the
// object (NewMachineScope, ClusterScope.LoadBalancerVM) and writes it back
// in one function whenever the object is patched; the services read and
// set its fields and never see the object.
type VM struct {
	// Domain is the libvirt domain's name; the VM's volumes are named
	// after it (OverlayVolume, SeedVolume, ConsoleLogVolume).
	Domain string
	// UUID is the domain's UUID: "" until the identity step chose or
	// adopted it. Written back once, where clusterctl move carries it.
	UUID string
	// MAC is the NIC's MAC: zero until the address step chose it or the
	// identity step adopted the domain's. Written back once.
	MAC netalloc.MAC
	// Hostname is the guest's hostname (a machine's is its Node's name).
	Hostname string
	// Owner is the ownership metadata every libvirt object of the VM
	// carries.
	Owner virt.Owner

	// Host names the libvirt host the VM is placed on (status).
	Host string
	// Pool is the storage pool of the VM's volumes.
	Pool virt.PoolSpec
	// Network is the network the NIC joins; zero until known.
	Network NetworkRef
	// Addressing is how the NIC gets its addresses, decided once from
	// Network and AddressPools (AddressingOf); every step reads it.
	Addressing Addressing
	// AddressPools are the IPAM pools the NIC's addresses come from
	// instead of DHCP; Nameservers its DNS servers then (unparsed, as
	// the spec has them).
	AddressPools []infrav1.IPPoolReference
	Nameservers  []string

	// Hardware is the virtual hardware, defaults applied.
	Hardware infrav1.VirtualHardware
	// Image is what the root disk is a copy of.
	Image infrav1.ImageSource
	// DiskSizeBytes is the root disk's size; zero for the image's own.
	DiskSizeBytes uint64
	// DataDisks are the empty disks attached after the root disk.
	DataDisks []DataDisk
	// HostDevices are the aliases of the PCI devices passed through, in
	// the operator's --host-devices.
	HostDevices []string

	// State is libvirt's state of the domain as the status last recorded
	// it, or as the domain step found it; "" after a move or a restore,
	// which keep no status.
	State string
	// Provisioned is set once the VM was reported provisioned: from then
	// on a vanished or dead domain is a terminal failure, and a guest that
	// stops answering keeps the addresses it last reported. Never set for
	// a Disposable VM.
	Provisioned bool
	// Disposable marks a VM that holds no state (the HAProxy VM): its
	// domain is looked up on every reconcile, and made again with its
	// volumes when it vanished.
	Disposable bool
	// BootstrapDataRemoved is set once the seed was rewritten without the
	// bootstrap data (kept in status).
	BootstrapDataRemoved bool
	// Addresses are the guest's IPs as the address check of this
	// reconcile read them, for the write-back; nil when it did not read
	// them.
	Addresses []string

	// placementRecorded is set by RecordPlacement.
	placementRecorded bool
	// object persists the VM and records events on its object; zero for
	// a VM built without one (a unit test's).
	object vmObject
}

// vmObject is the object a VM is written back to, as its scope reaches
// it. persist calls the scope's PatchObject when it runs, not a method
// value taken at build time: objectScope's methods have value receivers,
// and a method value would keep a copy without the write-back.
type vmObject struct {
	// persist writes the VM back and patches the object now.
	persist func(ctx context.Context) error
	// event records an event on the object.
	event func(eventType, reason, message string)
}

// DataDisk is one of a VM's data disks.
type DataDisk struct {
	// Name is the disk's name in the VM, and its serial in the guest.
	Name string
	// Pool is the pool of its volume: the one the spec names, else the
	// VM's.
	Pool string
	// SizeBytes is its virtual size.
	SizeBytes uint64
}

// DataDiskVolume is the name of the volume of the data disk named disk.
func (vm *VM) DataDiskVolume(disk string) string { return naming.DataDiskVolumeName(vm.Domain, disk) }

// OverlayVolume is the name of the root disk's volume.
func (vm *VM) OverlayVolume() string { return naming.OverlayVolumeName(vm.Domain) }

// SeedVolume is the name of the NoCloud seed's volume.
func (vm *VM) SeedVolume() string { return naming.SeedVolumeName(vm.Domain) }

// ConsoleLogVolume is the name of the serial console log's volume.
func (vm *VM) ConsoleLogVolume() string { return naming.ConsoleLogVolumeName(vm.Domain) }

// RecordPlacement has the write-back record the pool and network (once),
// before anything is created there, so that deletion finds them after the
// cluster's spec changed or the LibvirtCluster is gone.
func (vm *VM) RecordPlacement() { vm.placementRecorded = true }

// Persist writes the VM back and patches its object now: before something
// is created in libvirt whose identity must survive a crash (the MAC and
// placement).
func (vm *VM) Persist(ctx context.Context) error {
	if vm.object.persist == nil {
		return errors.New("the VM was not built from an object: nothing to persist it to")
	}
	return vm.object.persist(ctx)
}

// Event records an event on the VM's object; a VM built without one (a
// unit test's) records none.
func (vm *VM) Event(eventType, reason, message string) {
	if vm.object.event != nil {
		vm.object.event(eventType, reason, message)
	}
}

// domainStatus is the status.domain the write-back leaves: st updated
// with the VM's identity and state, created once the VM has a MAC or a
// state; nil while it has neither.
func (vm *VM) domainStatus(st *infrav1.DomainStatus) *infrav1.DomainStatus {
	if st == nil {
		if vm.MAC == "" && vm.State == "" {
			return nil
		}
		st = &infrav1.DomainStatus{}
	}
	st.Name, st.UUID = vm.Domain, vm.UUID
	if vm.Host != "" {
		st.Host = vm.Host
	}
	if vm.MAC != "" {
		st.MAC = vm.MAC.String()
	}
	if vm.State != "" {
		st.State = vm.State
	}
	return st
}

// recordedMAC is the MAC a status recorded, else the annotation it was
// recorded in, else zero.
func recordedMAC(st *infrav1.DomainStatus, annotation string) netalloc.MAC {
	if st != nil && st.MAC != "" {
		return netalloc.CanonicalMAC(st.MAC)
	}
	return netalloc.CanonicalMAC(annotation)
}

// recordedState is the domain state a status recorded; "" for none.
func recordedState(st *infrav1.DomainStatus) string {
	if st == nil {
		return ""
	}
	return st.State
}

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

// Addressing is how a VM's NIC gets its addresses.
type Addressing string

// The addressing modes.
const (
	// AddressingUnknown: the network is not known yet.
	AddressingUnknown Addressing = ""
	// AddressingReserved: a libvirt network, whose DHCP server the address
	// step reserves the NIC's address in; the guest's lease reports it
	// (the guest agent where libvirt serves no DHCP there).
	AddressingReserved Addressing = "Reserved"
	// AddressingLAN: a host bridge, whose LAN's DHCP server gives the
	// address; the guest agent reports it.
	AddressingLAN Addressing = "LAN"
	// AddressingPool: static addresses claimed from IPAM pools, given to
	// the guest in its seed; the guest agent reports them.
	AddressingPool Addressing = "Pool"
)

// AddressingOf is the addressing of a NIC on network with addresses from
// pools (none: DHCP).
func AddressingOf(network NetworkRef, pools []infrav1.IPPoolReference) Addressing {
	switch {
	case network.IsZero():
		return AddressingUnknown
	case len(pools) > 0:
		return AddressingPool
	case network.Bridge != "":
		return AddressingLAN
	default:
		return AddressingReserved
	}
}

// GuestInterface is the NIC's name in the guest as the capl images name
// it on the q35 machine type (images/README.md); cloud-init renames the
// NIC with the VM's MAC to it if the kernel chose another name.
const GuestInterface = "enp1s0"

// StaticNetworkConfig is the seed's network-config of a VM whose
// addresses came from IPAM pools (addresses, from the IPAM step); nil for
// a VM that takes DHCP.
func (vm *VM) StaticNetworkConfig(addresses []cloudinit.StaticAddress) ([]byte, error) {
	if len(addresses) == 0 {
		return nil, nil
	}
	nameservers := make([]netip.Addr, 0, len(vm.Nameservers))
	for _, ns := range vm.Nameservers {
		a, err := netip.ParseAddr(ns)
		if err != nil {
			return nil, fmt.Errorf("nameserver %q is not an IP address", ns)
		}
		nameservers = append(nameservers, a)
	}
	return cloudinit.StaticNIC{MAC: vm.MAC.String(), InterfaceName: GuestInterface, Addresses: addresses, Nameservers: nameservers}.NetworkConfig()
}
