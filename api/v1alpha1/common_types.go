package v1alpha1

// DomainType is the libvirt domain type, i.e. the accelerator QEMU uses.
// +kubebuilder:validation:Enum=kvm;qemu
type DomainType string

const (
	// DomainTypeKVM runs the guest with hardware virtualisation; the default.
	DomainTypeKVM DomainType = "kvm"
	// DomainTypeQEMU runs the guest under TCG software emulation, for hosts
	// without usable KVM (nested or paravirtual hosts, CI sandboxes).
	DomainTypeQEMU DomainType = "qemu"
)

// CPUMode is the libvirt CPU mode of a guest.
// +kubebuilder:validation:Enum=host-passthrough;host-model;maximum;custom
type CPUMode string

const (
	// CPUModeHostPassthrough exposes the host CPU unchanged; the default with KVM.
	CPUModeHostPassthrough CPUMode = "host-passthrough"
	// CPUModeHostModel exposes a named model close to the host CPU, which
	// keeps guests migratable between similar hosts.
	CPUModeHostModel CPUMode = "host-model"
	// CPUModeMaximum enables every feature the accelerator can offer; the
	// mode TCG needs to boot modern distribution kernels.
	CPUModeMaximum CPUMode = "maximum"
	// CPUModeCustom exposes the named cpuModel with the cpuFeatures it
	// requires, and nothing the host adds: a guest sees the same CPU on
	// every host that offers the model. Under TCG a plainer model than
	// maximum sends CPUID-driven code (Go's runtime and crypto, OpenSSL)
	// down paths that are cheaper to emulate (docs/tcg.md).
	CPUModeCustom CPUMode = "custom"
)

// VirtualHardware is the shape of a virtual machine, shared by cluster
// machines and the load-balancer VM. Zero values take the defaults of the
// object that embeds it. Embedders repeat its cross-field rule
// (host-passthrough needs kvm; cpuModel and cpuFeatures go with cpuMode
// custom) because CRD generation drops type-level rules
// of inlined structs.
type VirtualHardware struct {
	// cpus is the number of virtual CPUs.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=512
	CPUs int32 `json:"cpus,omitempty"`

	// memoryMiB is the guest memory in MiB.
	// +optional
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=4194304
	MemoryMiB int32 `json:"memoryMiB,omitempty"`

	// domainType selects the accelerator: kvm (hardware virtualisation) or
	// qemu (TCG software emulation, slow but works without usable KVM).
	// +optional
	// +kubebuilder:default=kvm
	DomainType DomainType `json:"domainType,omitempty"`

	// cpuMode is the libvirt CPU mode. Defaults to host-passthrough for kvm
	// and to maximum for qemu, which TCG needs to boot current kernels.
	// +optional
	CPUMode CPUMode `json:"cpuMode,omitempty"`

	// cpuModel is the CPU model of cpuMode custom, one the host offers
	// (virsh domcapabilities lists them: qemu64, Nehalem, Westmere, ...).
	// A domain with a model the host lacks does not start.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.-]*$`
	CPUModel string `json:"cpuModel,omitempty"`

	// cpuFeatures are CPU features cpuMode custom requires on top of
	// cpuModel (e.g. sse4.2, popcnt, aes); a host without one does not
	// start the domain.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9][a-z0-9_.-]*$`
	CPUFeatures []string `json:"cpuFeatures,omitempty"`

	// tcgTranslationCacheMiB bounds QEMU's TCG translation cache for qemu
	// domains. Left unset, QEMU sizes it from guest memory, which can cost
	// several hundred MiB of host memory per VM. Ignored for kvm domains.
	// +optional
	// +kubebuilder:validation:Minimum=32
	// +kubebuilder:validation:Maximum=4096
	TCGTranslationCacheMiB int32 `json:"tcgTranslationCacheMiB,omitempty"`

	// cpuShares is the VM's weight when the host's CPUs are contended,
	// relative to other VMs (libvirt's cputune shares: a VM with 2048 gets
	// twice the CPU time of one with 1024). Unset keeps the host's default
	// (1024 with cgroup v1, 100 with cgroup v2), so set it on every machine
	// of a host to compare like with like. Under TCG on a small host,
	// weighting the control plane above its workers keeps more CPU for its
	// API server while they boot, and slows their boot. 0 is the same as
	// unset; 1 is refused because cgroup v1 hosts refuse it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:validation:XValidation:rule="self != 1",message="cpuShares must be 0 (the host's default) or 2-10000"
	CPUShares int32 `json:"cpuShares,omitempty"`
}

// ImageSource is the base disk image a guest's overlay is created from:
// either a volume already in a libvirt storage pool, or a URL the provider
// imports into the pool once, verified against its checksum.
// +kubebuilder:validation:XValidation:rule="has(self.volume) != has(self.url)",message="exactly one of volume and url must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.url) || has(self.checksum)",message="checksum is required when url is set"
// +kubebuilder:validation:XValidation:rule="!has(self.checksum) || has(self.url)",message="checksum applies only to url"
type ImageSource struct {
	// volume names an existing volume in a storage pool.
	// +optional
	Volume *VolumeReference `json:"volume,omitempty"`

	// url is where the image is downloaded from (http, https) or read from
	// on the manager's host (file).
	// +optional
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(https?|file)://`
	URL string `json:"url,omitempty"`

	// checksum of the image at url, as "sha256:" followed by 64 lower-case
	// hexadecimal digits.
	// +optional
	// +kubebuilder:validation:Pattern=`^sha256:[a-f0-9]{64}$`
	Checksum string `json:"checksum,omitempty"`
}

// VolumeReference names a volume in a libvirt storage pool.
type VolumeReference struct {
	// pool is the storage pool holding the volume; empty means the
	// cluster's storage pool.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool,omitempty"`

	// name is the volume name within the pool.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[^/]+$`
	Name string `json:"name"`
}

// NetworkAttachment selects where a guest's NIC is plugged: an existing
// libvirt network or an existing host bridge (at most one may be set;
// neither keeps the cluster's network), and where its addresses come from.
// +kubebuilder:validation:XValidation:rule="!(has(self.name) && has(self.bridge))",message="at most one of name and bridge may be set"
// +kubebuilder:validation:XValidation:rule="!has(self.nameservers) || size(self.nameservers) == 0 || (has(self.addressesFromPools) && size(self.addressesFromPools) > 0)",message="nameservers go with addressesFromPools (DHCP brings its own)"
type NetworkAttachment struct {
	// name of an existing libvirt network. The provider never modifies or
	// deletes a network it did not create, except for DHCP host entries of
	// its own machines.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// bridge is an existing Linux bridge on the host (e.g. br0 on a
	// homelab LAN). Addresses are then read through the guest agent,
	// since libvirt sees no DHCP leases there.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_.-]{1,15}$`
	Bridge string `json:"bridge,omitempty"`

	// addressesFromPools takes the NIC's addresses from Cluster API IPAM
	// pools (at most one IPv4 and one IPv6): the provider claims one
	// address from each (an IPAddressClaim owned by the LibvirtMachine,
	// released with it) and gives the guest the address, prefix and
	// gateway as a static configuration instead of DHCP. Only on a host
	// bridge or an existing libvirt network: the networks the provider
	// makes for a cluster reserve addresses in their own DHCP server.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	AddressesFromPools []IPPoolReference `json:"addressesFromPools,omitempty"`

	// nameservers are the DNS servers of a NIC with addressesFromPools
	// (an IPAM address carries none); without them the guest resolves
	// nothing.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:MaxLength=39
	Nameservers []string `json:"nameservers,omitempty"`
}

// IPPoolReference names a Cluster API IPAM pool in the machine's
// namespace (or a cluster-wide pool kind), as an IPAddressClaim does.
type IPPoolReference struct {
	// apiGroup of the pool, e.g. ipam.cluster.x-k8s.io for the in-cluster
	// IPAM provider.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	APIGroup string `json:"apiGroup"`

	// kind of the pool, e.g. InClusterIPPool or GlobalInClusterIPPool.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Kind string `json:"kind"`

	// name of the pool.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// Initialization reports the provisioning milestones Cluster API reads.
type Initialization struct {
	// provisioned is true once the infrastructure is ready for use. It
	// never returns to false.
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// IsProvisioned tells whether provisioned is set and true.
func (i Initialization) IsProvisioned() bool {
	return i.Provisioned != nil && *i.Provisioned
}
