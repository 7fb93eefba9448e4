// Package scope holds what one reconcile of a LibvirtMachine or a
// LibvirtCluster works on: the Kubernetes objects, the libvirt host, the
// names of their libvirt objects (made by pkg/naming), and the patch that
// persists the outcome.
package scope

import (
	"context"
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Annotations record where a machine's libvirt objects were placed, so that
// deletion finds the pool and network even when the LibvirtCluster is gone.
const (
	// PoolAnnotation names the storage pool of the machine's volumes.
	PoolAnnotation = "libvirt.infrastructure.cluster.x-k8s.io/pool"
	// NetworkAnnotation is "network:<name>" or "bridge:<bridge>".
	NetworkAnnotation = "libvirt.infrastructure.cluster.x-k8s.io/network"
	// MACAnnotation is the NIC's MAC, chosen once: with the network's
	// reservation for it, it is the machine's address across a
	// clusterctl move or a restore, which keep annotations but no status.
	MACAnnotation = "libvirt.infrastructure.cluster.x-k8s.io/mac"
)

// Terminal failure reasons, as Cluster API's MachineStatusError names them.
const (
	// FailureReasonUpdate: the machine's infrastructure changed or broke
	// after it was provisioned (domain vanished, replaced, cannot restart).
	FailureReasonUpdate = "UpdateError"
	// FailureReasonCreate: the machine's infrastructure cannot be created.
	FailureReasonCreate = "CreateError"
)

// StepConditions are the conditions of the provisioning steps, in order;
// Ready summarises them.
var StepConditions = []string{
	infrav1.AddressReservedCondition,
	infrav1.DiskReadyCondition,
	infrav1.BootstrapDataReadyCondition,
	infrav1.DomainReadyCondition,
	infrav1.AddressAssignedCondition,
	infrav1.BootstrapSucceededCondition,
}

// MachineScopeParams are the inputs of NewMachineScope. Cluster, Machine
// and LibvirtCluster may be nil while the LibvirtMachine is deleted.
type MachineScopeParams struct {
	Client         client.Client
	Cluster        *clusterv1.Cluster
	Machine        *clusterv1.Machine
	LibvirtCluster *infrav1.LibvirtCluster
	LibvirtMachine *infrav1.LibvirtMachine
	// Host is the libvirt host of the machine's failure domain.
	Host virt.Host
	// HostName names Host in status.domain.host.
	HostName string
	// FailureDomain is where the controller placed the machine.
	FailureDomain string
	Recorder      record.EventRecorder
}

// MachineScope is one reconcile of one LibvirtMachine.
type MachineScope struct {
	Client         client.Client
	Cluster        *clusterv1.Cluster
	Machine        *clusterv1.Machine
	LibvirtCluster *infrav1.LibvirtCluster
	LibvirtMachine *infrav1.LibvirtMachine
	Host           virt.Host
	HostName       string

	failureDomain string
	objectScope
	vmVolumes
	// domainFound is set when this reconcile found the machine's domain.
	domainFound bool
	// bootstrapSucceeded is set when this reconcile's bootstrap check
	// found the bootstrap done.
	bootstrapSucceeded bool
}

// NewMachineScope builds the scope and snapshots the LibvirtMachine for
// the patch Close sends.
func NewMachineScope(p MachineScopeParams) (*MachineScope, error) {
	if p.Client == nil || p.LibvirtMachine == nil || p.Host == nil {
		return nil, errors.New("machine scope needs a client, a LibvirtMachine and a host")
	}
	o, err := newObjectScope(p.Client, p.LibvirtMachine, p.Recorder, StepConditions)
	if err != nil {
		return nil, err
	}
	return &MachineScope{
		Client: p.Client, Cluster: p.Cluster, Machine: p.Machine, LibvirtCluster: p.LibvirtCluster,
		LibvirtMachine: p.LibvirtMachine, Host: p.Host, HostName: p.HostName, failureDomain: p.FailureDomain, objectScope: o,
	}, nil
}

// Name is the LibvirtMachine's name.
func (s *MachineScope) Name() string { return s.LibvirtMachine.Name }

// Namespace is the LibvirtMachine's namespace.
func (s *MachineScope) Namespace() string { return s.LibvirtMachine.Namespace }

// DomainName is the libvirt domain's name (see DomainName).
func (s *MachineScope) DomainName() string { return naming.DomainName(s.Namespace(), s.Name()) }

// OverlayVolume is the name of the root disk volume.
func (s *MachineScope) OverlayVolume() string { return naming.OverlayVolumeName(s.DomainName()) }

// SeedVolume is the name of the NoCloud seed volume.
func (s *MachineScope) SeedVolume() string { return naming.SeedVolumeName(s.DomainName()) }

// ConsoleLogVolume is the name of the machine's console log volume.
func (s *MachineScope) ConsoleLogVolume() string { return naming.ConsoleLogVolumeName(s.DomainName()) }

// DomainUUID is the domain's UUID, chosen once and kept in spec.providerID
// (which clusterctl move and restores carry): "" until the identity step
// chose or adopted it.
func (s *MachineScope) DomainUUID() string {
	return strings.TrimPrefix(s.LibvirtMachine.Spec.ProviderID, infrav1.ProviderIDPrefix)
}

// SetDomainUUID records the domain's UUID in spec.providerID, which is
// immutable once set.
func (s *MachineScope) SetDomainUUID(uuid string) {
	if s.LibvirtMachine.Spec.ProviderID == "" {
		s.LibvirtMachine.Spec.ProviderID = infrav1.ProviderIDPrefix + strings.ToLower(uuid)
	}
}

// DomainSeen tells whether the status recorded the domain's state.
func (s *MachineScope) DomainSeen() bool {
	d := s.LibvirtMachine.Status.Domain
	return d != nil && d.State != ""
}

// SetDomainFound records that the machine's domain exists: the volumes it
// was defined on are complete, whatever the status says.
func (s *MachineScope) SetDomainFound() { s.domainFound = true }

// DomainDefined tells whether the machine's domain exists in libvirt: this
// reconcile found it, or status.domain holds the state libvirt reported.
func (s *MachineScope) DomainDefined() bool { return s.domainFound || s.DomainSeen() }

// Hostname is the guest's hostname and so its Node name: the Machine's name.
func (s *MachineScope) Hostname() string {
	if s.Machine != nil {
		return s.Machine.Name
	}
	return s.Name()
}

// ClusterName is the Cluster API cluster the machine belongs to.
func (s *MachineScope) ClusterName() string {
	if s.Machine != nil && s.Machine.Spec.ClusterName != "" {
		return s.Machine.Spec.ClusterName
	}
	return s.LibvirtMachine.Labels[clusterv1.ClusterNameLabel]
}

// Owner is recorded in the domain's metadata; libvirt events carry it back.
func (s *MachineScope) Owner() virt.Owner {
	return virt.Owner{
		Kind: "LibvirtMachine", Namespace: s.Namespace(), Name: s.Name(),
		UID: string(s.LibvirtMachine.UID), Cluster: s.ClusterName(),
	}
}

// FailureDomain is where the machine is placed (the controller's
// placement: spec.failureDomain once recorded, else the Machine's, else
// the least used); empty for none (the manager's host).
func (s *MachineScope) FailureDomain() string { return s.failureDomain }

// RecordFailureDomain writes the machine's failure domain to spec (once,
// persisted at once: nothing may be created on a host before the choice
// of host is stored) when the cluster lists failure domains, and to
// status.failureDomain.
func (s *MachineScope) RecordFailureDomain(ctx context.Context) error {
	fd := s.failureDomain
	s.LibvirtMachine.Status.FailureDomain = fd
	if s.LibvirtMachine.Spec.FailureDomain != "" || fd == "" || s.LibvirtCluster == nil || len(s.LibvirtCluster.Spec.FailureDomains) == 0 {
		return nil
	}
	s.LibvirtMachine.Spec.FailureDomain = fd
	return s.PatchObject(ctx)
}

// BootstrapDataSecretName is the Machine's bootstrap Secret, nil until the
// bootstrap provider sets it.
func (s *MachineScope) BootstrapDataSecretName() *string {
	if s.Machine == nil {
		return nil
	}
	return s.Machine.Spec.Bootstrap.DataSecretName
}

// IsControlPlane tells whether the machine is a control-plane machine.
func (s *MachineScope) IsControlPlane() bool {
	_, ok := s.LibvirtMachine.Labels[clusterv1.MachineControlPlaneLabel]
	if s.Machine != nil {
		_, ok = s.Machine.Labels[clusterv1.MachineControlPlaneLabel]
	}
	return ok
}

// ClusterInfrastructureProvisioned tells whether the Cluster reports its
// infrastructure provisioned.
func (s *MachineScope) ClusterInfrastructureProvisioned() bool {
	return s.Cluster != nil && ptr.Deref(s.Cluster.Status.Initialization.InfrastructureProvisioned, false)
}

// Pool is the storage pool of the machine's volumes: the one recorded on
// the LibvirtMachine, else the LibvirtCluster's, else the default. Path is
// empty when the pool must already exist (a named pool without a path, or
// a recorded pool that is no longer the cluster's).
func (s *MachineScope) Pool() virt.PoolSpec {
	return recordedPool(ClusterPool(s.LibvirtCluster), s.LibvirtMachine.Annotations)
}

// Network is the machine's network: the one recorded on the LibvirtMachine
// once something was created on it, else spec.network, else the
// LibvirtCluster's status.network. Zero when none is known yet.
func (s *MachineScope) Network() NetworkRef {
	if recorded := ParseNetworkRef(s.LibvirtMachine.Annotations[NetworkAnnotation]); !recorded.IsZero() {
		return recorded
	}
	if o := s.LibvirtMachine.Spec.Network; o != nil && (o.Name != "" || o.Bridge != "") {
		return NetworkRef{Name: o.Name, Bridge: o.Bridge}
	}
	if s.LibvirtCluster != nil && s.LibvirtCluster.Status.Network != nil {
		n := s.LibvirtCluster.Status.Network
		if n.Name != "" {
			return NetworkRef{Name: n.Name}
		}
		return NetworkRef{Bridge: n.Bridge}
	}
	return NetworkRef{}
}

// RecordPlacement writes pool and network into annotations (once), before
// anything is created there; PatchObject persists them.
func (s *MachineScope) RecordPlacement() {
	a := s.LibvirtMachine.Annotations
	if a == nil {
		a = map[string]string{}
	}
	if a[PoolAnnotation] == "" {
		a[PoolAnnotation] = s.Pool().Name
	}
	if a[NetworkAnnotation] == "" {
		if n := s.Network(); !n.IsZero() {
			a[NetworkAnnotation] = n.String()
		}
	}
	s.LibvirtMachine.Annotations = a
}

// Hardware is the machine's virtual hardware with defaults applied.
func (s *MachineScope) Hardware() infrav1.VirtualHardware {
	return defaultHardware(s.LibvirtMachine.Spec.VirtualHardware, infrav1.DefaultMachineCPUs, infrav1.DefaultMachineMemoryMiB)
}

// DiskSizeBytes is the requested root disk size.
func (s *MachineScope) DiskSizeBytes() uint64 {
	gib := s.LibvirtMachine.Spec.DiskSizeGiB
	if gib == 0 {
		gib = infrav1.DefaultDiskSizeGiB
	}
	return uint64(gib) << 30
}

// MAC is the NIC's MAC once chosen (status.domain.mac, else the
// annotation it was recorded in), else "".
func (s *MachineScope) MAC() netalloc.MAC {
	if d := s.LibvirtMachine.Status.Domain; d != nil && d.MAC != "" {
		return netalloc.CanonicalMAC(d.MAC)
	}
	return netalloc.CanonicalMAC(s.LibvirtMachine.Annotations[MACAnnotation])
}

// domainStatus returns status.domain, creating it with the derived
// identity filled in.
func (s *MachineScope) domainStatus() *infrav1.DomainStatus {
	st := &s.LibvirtMachine.Status
	if st.Domain == nil {
		st.Domain = &infrav1.DomainStatus{}
	}
	st.Domain.Name = s.DomainName()
	st.Domain.UUID = s.DomainUUID()
	st.Domain.Host = s.HostName
	return st.Domain
}

// SetMAC records the chosen MAC in status.domain and in its annotation.
func (s *MachineScope) SetMAC(mac netalloc.MAC) {
	s.domainStatus().MAC = mac.String()
	annotateOnce(s.LibvirtMachine, MACAnnotation, mac.String())
}

// annotateOnce sets an annotation of obj unless it is set: what it records
// was chosen once.
func annotateOnce(obj metav1.Object, key, value string) {
	a := obj.GetAnnotations()
	if a[key] != "" {
		return
	}
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	obj.SetAnnotations(a)
}

// SetDomainState records libvirt's state of the domain.
func (s *MachineScope) SetDomainState(state string) { s.domainStatus().State = state }

// SetAddresses replaces status.addresses: the InternalIPs, then the Hostname.
func (s *MachineScope) SetAddresses(ips []string) {
	out := make([]clusterv1.MachineAddress, 0, len(ips)+1)
	for _, ip := range ips {
		out = append(out, clusterv1.MachineAddress{Type: clusterv1.MachineInternalIP, Address: ip})
	}
	out = append(out, clusterv1.MachineAddress{Type: clusterv1.MachineHostName, Address: s.Hostname()})
	s.LibvirtMachine.Status.Addresses = out
}

// Spec is the machine's spec.
func (s *MachineScope) Spec() *infrav1.LibvirtMachineSpec { return &s.LibvirtMachine.Spec }

// Object is the LibvirtMachine.
func (s *MachineScope) Object() *infrav1.LibvirtMachine { return s.LibvirtMachine }

// SetBootstrapSucceeded records that this reconcile's bootstrap check
// found the bootstrap done (in the guest, or in the emptied seed).
func (s *MachineScope) SetBootstrapSucceeded() { s.bootstrapSucceeded = true }

// BootstrapSucceeded tells whether this reconcile's bootstrap check found
// the bootstrap done.
func (s *MachineScope) BootstrapSucceeded() bool { return s.bootstrapSucceeded }

// BootstrapDataRemoved tells whether the seed was rewritten without the
// bootstrap data.
func (s *MachineScope) BootstrapDataRemoved() bool {
	return s.LibvirtMachine.Status.BootstrapDataRemoved
}

// SetBootstrapDataRemoved records that the seed holds no bootstrap data.
func (s *MachineScope) SetBootstrapDataRemoved() { s.LibvirtMachine.Status.BootstrapDataRemoved = true }

// IsProvisioned tells whether the machine was ever reported provisioned.
func (s *MachineScope) IsProvisioned() bool {
	return s.LibvirtMachine.Status.Initialization.IsProvisioned()
}

// SetProvisioned reports the machine provisioned, in both contract forms;
// it is never reset.
func (s *MachineScope) SetProvisioned() {
	if !s.IsProvisioned() {
		s.Event(corev1.EventTypeNormal, "Provisioned", "Machine infrastructure is provisioned")
	}
	s.LibvirtMachine.Status.Initialization.Provisioned = ptr.To(true)
	s.LibvirtMachine.Status.Ready = true
}

// HasFailed tells whether a terminal failure was recorded.
func (s *MachineScope) HasFailed() bool {
	st := s.LibvirtMachine.Status
	return st.FailureReason != nil || st.FailureMessage != nil
}

// SetFailure records a terminal failure; the machine is then left alone
// until deleted, so that a MachineHealthCheck can replace it.
func (s *MachineScope) SetFailure(reason, message string) {
	s.LibvirtMachine.Status.FailureReason = ptr.To(reason)
	s.LibvirtMachine.Status.FailureMessage = ptr.To(message)
	s.Event(corev1.EventTypeWarning, "TerminalFailure", message)
}
