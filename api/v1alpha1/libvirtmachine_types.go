package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// MachineFinalizer lets the machine controller remove the VM and its
// volumes before the LibvirtMachine is gone. It is domain-qualified with a
// path, as the API server asks of finalizers.
const MachineFinalizer = "infrastructure.cluster.x-k8s.io/libvirtmachine"

// LegacyMachineFinalizer is MachineFinalizer's name in builds before
// 2026-11-28 (see LegacyClusterFinalizer).
const LegacyMachineFinalizer = "libvirtmachine.infrastructure.cluster.x-k8s.io"

// ProviderIDPrefix starts every providerID this provider sets; the domain
// UUID follows. Node and Machine agree on it without a cloud controller
// because the kubelet reads the same UUID from cloud-init's instance-id.
const ProviderIDPrefix = "libvirt:///"

// Default values the machine controller applies to zero fields.
const (
	// DefaultMachineCPUs is the vCPU count of a machine that names none:
	// kubeadm's preflight refuses a control plane with fewer than two.
	DefaultMachineCPUs = 2
	// DefaultMachineMemoryMiB is the memory of a machine that names none:
	// kubeadm's preflight wants 1700 MiB on a control plane.
	DefaultMachineMemoryMiB = 2048
	// DefaultDiskSizeGiB is the root disk size of a machine; a base image
	// with a larger virtual size wins.
	DefaultDiskSizeGiB = 20
)

// LibvirtMachineSpec is the desired state of a LibvirtMachine.
// +kubebuilder:validation:XValidation:rule="!(has(self.domainType) && self.domainType == 'qemu' && has(self.cpuMode) && self.cpuMode == 'host-passthrough')",message="cpuMode host-passthrough needs domainType kvm; use maximum with qemu"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)",message="providerID is immutable once set"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.failureDomain) || (has(self.failureDomain) && self.failureDomain == oldSelf.failureDomain)",message="failureDomain is immutable once set"
// +kubebuilder:validation:XValidation:rule="(has(self.cpuMode) && self.cpuMode == 'custom') == has(self.cpuModel)",message="cpuModel is set exactly when cpuMode is custom"
// +kubebuilder:validation:XValidation:rule="!has(self.cpuFeatures) || (has(self.cpuMode) && self.cpuMode == 'custom')",message="cpuFeatures apply only to cpuMode custom"
type LibvirtMachineSpec struct {
	// providerID is libvirt:///<domain UUID>, set by the provider once,
	// when it chose the UUID (or adopted the one of the domain this machine
	// owns) and before it created anything: a moved or restored machine
	// keeps its domain through it.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^libvirt:///[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	ProviderID string `json:"providerID,omitempty"`

	// image is the base image of the machine's root disk, which is a qcow2
	// overlay on it.
	// +required
	Image ImageSource `json:"image"`

	// The machine's hardware; defaults to 2 vCPUs and 2048 MiB with kvm.
	VirtualHardware `json:",inline"`

	// diskSizeGiB is the size of the root disk; a base image whose virtual
	// size is larger keeps its size. Defaults to 20.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	DiskSizeGiB int32 `json:"diskSizeGiB,omitempty"`

	// dataDisks are empty disks attached after the root disk, each a qcow2
	// volume of its own created with the machine and deleted with it (for
	// Longhorn, Rook, a separate etcd disk). The guest sees each as
	// /dev/disk/by-id/virtio-<name>. They count in the operator's largest
	// disk (--max-machine-disk, with the root disk) and the namespace's
	// totals.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	DataDisks []DataDisk `json:"dataDisks,omitempty"`

	// hostDevices are PCI devices of the host (a GPU, a NIC, an HBA) passed
	// through to the machine whole, with VFIO, each named by the alias the
	// operator gave it (the manager's --host-devices): a tenant never names
	// a PCI address. The machine goes only to a host that has every device
	// and no other running domain holds it; it waits with reason
	// WaitingForHostDevice otherwise. Needs an IOMMU on the host.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	HostDevices []HostDevice `json:"hostDevices,omitempty"`

	// network overrides the cluster's network for this machine.
	// +optional
	Network *NetworkAttachment `json:"network,omitempty"`

	// failureDomain is the failure domain (libvirt host) the machine was
	// placed in, set by the provider once, before it creates anything: the
	// Machine's spec.failureDomain, or the cluster's least used failure
	// domain when the Machine names none. A moved or restored machine finds
	// its host through it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	FailureDomain string `json:"failureDomain,omitempty"`
}

// DataDisk is an empty disk of a machine besides its root disk.
type DataDisk struct {
	// name identifies the disk in the machine: its volume's name ends in it
	// and the guest sees it as /dev/disk/by-id/virtio-<name> (virtio's
	// serial holds 20 characters).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// sizeGiB is the disk's virtual size; the volume is sparse and grows as
	// the guest writes.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	SizeGiB int32 `json:"sizeGiB"`

	// pool is the storage pool of the disk's volume; defaults to the pool
	// of the machine's root disk. A pool other than that must exist, and
	// the operator must allow it (the manager's --storage-pools).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool,omitempty"`
}

// HostDevice is a PCI device of the host that a machine takes whole.
type HostDevice struct {
	// name is the device's alias in the operator's --host-devices.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// LibvirtMachineStatus is the observed state of a LibvirtMachine.
type LibvirtMachineStatus struct {
	// conditions: Ready summarises the provisioning steps; each step has
	// its own condition with a reason.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialization reports when the machine's infrastructure is
	// provisioned: the domain runs and has an address.
	// +optional
	Initialization Initialization `json:"initialization,omitempty,omitzero"`

	// ready mirrors initialization.provisioned for readers of the v1beta1 contract.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// bootstrapDataRemoved is true once the seed ISO was rewritten without
	// the bootstrap data (join tokens, certificate keys) after bootstrap
	// succeeded; lost (clusterctl move, a restore), the rewrite is only
	// done again.
	// +optional
	BootstrapDataRemoved bool `json:"bootstrapDataRemoved,omitempty"`

	// addresses of the machine: its InternalIP first, then its Hostname.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Addresses []clusterv1.MachineAddress `json:"addresses,omitempty"`

	// failureDomain the machine was placed in.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	FailureDomain string `json:"failureDomain,omitempty"`

	// domain shows the libvirt domain backing the machine.
	// +optional
	Domain *DomainStatus `json:"domain,omitempty"`

	// failureReason is set when the machine cannot be recovered (its domain
	// vanished or was replaced outside the provider, or crashed and cannot
	// restart), so that a MachineHealthCheck replaces it.
	// +optional
	FailureReason *string `json:"failureReason,omitempty"`

	// failureMessage explains failureReason.
	// +optional
	FailureMessage *string `json:"failureMessage,omitempty"`
}

// DomainStatus shows a libvirt domain the provider manages.
type DomainStatus struct {
	// name of the domain on its host.
	// +optional
	Name string `json:"name,omitempty"`
	// uuid the provider chose for the domain; providerID carries it.
	// +optional
	UUID string `json:"uuid,omitempty"`
	// mac address of the domain's NIC, chosen by the provider.
	// +optional
	MAC string `json:"mac,omitempty"`
	// state as libvirt reports it: running, shutoff, crashed, paused, ...
	// +optional
	State string `json:"state,omitempty"`
	// host is the libvirt host (its hostname) running the domain.
	// +optional
	Host string `json:"host,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=libvirtmachines,scope=Namespaced,categories=cluster-api
// +kubebuilder:storageversion
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",description="Cluster to which this LibvirtMachine belongs"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status",description="Every provisioning step done (the Ready condition)"
// +kubebuilder:printcolumn:name="Provisioned",type="boolean",JSONPath=".status.initialization.provisioned",description="Machine infrastructure is provisioned"
// +kubebuilder:printcolumn:name="Host",type="string",JSONPath=".status.domain.host",description="libvirt host running the domain"
// +kubebuilder:printcolumn:name="State",type="string",JSONPath=".status.domain.state",description="libvirt domain state"
// +kubebuilder:printcolumn:name="Address",type="string",JSONPath=".status.addresses[0].address",description="Primary address"
// +kubebuilder:printcolumn:name="ProviderID",type="string",JSONPath=".spec.providerID",description="Provider ID (libvirt:///<domain UUID>)",priority=1
// +kubebuilder:printcolumn:name="FailureDomain",type="string",JSONPath=".spec.failureDomain",priority=1
// +kubebuilder:printcolumn:name="Machine",type="string",JSONPath=".metadata.ownerReferences[?(@.kind==\"Machine\")].name",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// LibvirtMachine is the infrastructure of one Cluster API Machine: a libvirt
// domain booting a qcow2 overlay of a base image with a NoCloud seed.
type LibvirtMachine struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +optional
	Spec LibvirtMachineSpec `json:"spec,omitempty,omitzero"`
	// status is the observed state.
	// +optional
	Status LibvirtMachineStatus `json:"status,omitempty,omitzero"`
}

// GetConditions returns the conditions, for Cluster API's condition utilities.
func (m *LibvirtMachine) GetConditions() []metav1.Condition { return m.Status.Conditions }

// SetConditions replaces the conditions, for Cluster API's condition utilities.
func (m *LibvirtMachine) SetConditions(conditions []metav1.Condition) {
	m.Status.Conditions = conditions
}

// +kubebuilder:object:root=true

// LibvirtMachineList is a list of LibvirtMachines.
type LibvirtMachineList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the LibvirtMachines.
	Items []LibvirtMachine `json:"items"`
}

func init() {
	SchemeBuilder.Register(&LibvirtMachine{}, &LibvirtMachineList{})
}
