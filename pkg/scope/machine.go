// Package scope holds what one reconcile of a LibvirtMachine or a
// LibvirtCluster works on: the Kubernetes objects, the libvirt host, the
// names of their libvirt objects (made by pkg/naming), and the patch that
// persists the outcome.
package scope

import (
	"context"
	"errors"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
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
	// VM is the machine's VM, built from the objects by NewMachineScope
	// and written back to the LibvirtMachine by every patch.
	VM *VM

	failureDomain string
	objectScope
}

// NewMachineScope builds the scope and its VM, and snapshots the
// LibvirtMachine for the patch Close sends.
func NewMachineScope(p MachineScopeParams) (*MachineScope, error) {
	if p.Client == nil || p.LibvirtMachine == nil || p.Host == nil {
		return nil, errors.New("machine scope needs a client, a LibvirtMachine and a host")
	}
	o, err := newObjectScope(p.Client, "LibvirtMachine", p.LibvirtMachine, p.Recorder, StepConditions)
	if err != nil {
		return nil, err
	}
	s := &MachineScope{
		Client: p.Client, Cluster: p.Cluster, Machine: p.Machine, LibvirtCluster: p.LibvirtCluster,
		LibvirtMachine: p.LibvirtMachine, Host: p.Host, failureDomain: p.FailureDomain, objectScope: o,
	}
	s.VM = s.machineVM(p.HostName)
	s.writeBack = s.writeVM
	if !recreated(p.LibvirtMachine) {
		s.reached = s.observeProvisioning
	}
	return s, nil
}

// recreated tells a LibvirtMachine that clusterctl move or a restore
// recreated, with its identity but no status: its creation time is the
// copy's, so its steps are not timed.
func recreated(lm *infrav1.LibvirtMachine) bool {
	return lm.Spec.ProviderID != "" && len(lm.Status.Conditions) == 0
}

// observeProvisioning times, from the machine's creation, a step
// condition turning True before the machine is provisioned, and its
// provisioning (capl_machine_provisioning_seconds).
func (s *MachineScope) observeProvisioning(step string) {
	if s.IsProvisioned() && step != metrics.ProvisionedStep {
		return
	}
	created := s.LibvirtMachine.CreationTimestamp.Time
	metrics.MachineProvisioning.WithLabelValues(step).Observe(time.Since(created).Seconds())
}

// machineVM builds the machine's VM from its objects: identity from
// spec.providerID and the MAC recorded in status or annotation, placement
// from the annotations (once recorded) or the specs, progress from status.
func (s *MachineScope) machineVM(hostName string) *VM {
	lm := s.LibvirtMachine
	spec, st := &lm.Spec, lm.Status.Domain
	domain := naming.DomainName(lm.Namespace, lm.Name)
	pool := recordedPool(ClusterPool(s.LibvirtCluster), lm.Annotations)
	vm := &VM{
		Domain:   domain,
		UUID:     strings.TrimPrefix(spec.ProviderID, infrav1.ProviderIDPrefix),
		MAC:      recordedMAC(st, lm.Annotations[MACAnnotation]),
		Hostname: lm.Name,
		Owner: virt.Owner{
			Kind: "LibvirtMachine", Namespace: lm.Namespace, Name: lm.Name,
			UID: string(lm.UID), Cluster: s.ClusterName(),
		},
		Host:                 hostName,
		Pool:                 pool,
		Network:              s.network(),
		AddressPools:         addressPools(spec.Network),
		Nameservers:          nameservers(spec.Network),
		Hardware:             defaultHardware(spec.VirtualHardware, infrav1.DefaultMachineCPUs, infrav1.DefaultMachineMemoryMiB),
		Image:                spec.Image,
		DiskSizeBytes:        diskSizeBytes(spec.DiskSizeGiB),
		DataDisks:            dataDisks(spec.DataDisks, pool.Name),
		HostDevices:          hostDevices(spec.HostDevices),
		State:                recordedState(st),
		Provisioned:          s.IsProvisioned(),
		BootstrapDataRemoved: lm.Status.BootstrapDataRemoved,
		object:               vmObject{persist: func(ctx context.Context) error { return s.PatchObject(ctx) }, event: s.Event},
	}
	vm.Addressing = AddressingOf(vm.Network, vm.AddressPools)
	if s.Machine != nil {
		vm.Hostname = s.Machine.Name
	}
	return vm
}

// writeVM writes the VM back to the LibvirtMachine before every patch: the UUID into
// spec.providerID and the MAC into its annotation (each once, as
// clusterctl move carries them), the placement annotations once recorded,
// status.domain, the addresses the guest reported and the seed's state.
func (s *MachineScope) writeVM() {
	vm, lm := s.VM, s.LibvirtMachine
	if lm.Spec.ProviderID == "" && vm.UUID != "" {
		lm.Spec.ProviderID = infrav1.ProviderIDPrefix + strings.ToLower(vm.UUID)
	}
	if vm.MAC != "" {
		annotateOnce(lm, MACAnnotation, vm.MAC.String())
	}
	if vm.placementRecorded {
		annotateOnce(lm, PoolAnnotation, vm.Pool.Name)
		if !vm.Network.IsZero() {
			annotateOnce(lm, NetworkAnnotation, vm.Network.String())
		}
	}
	lm.Status.Domain = vm.domainStatus(lm.Status.Domain)
	if vm.Addresses != nil {
		out := make([]clusterv1.MachineAddress, 0, len(vm.Addresses)+1)
		for _, ip := range vm.Addresses {
			out = append(out, clusterv1.MachineAddress{Type: clusterv1.MachineInternalIP, Address: ip})
		}
		lm.Status.Addresses = append(out, clusterv1.MachineAddress{Type: clusterv1.MachineHostName, Address: vm.Hostname})
	}
	lm.Status.BootstrapDataRemoved = lm.Status.BootstrapDataRemoved || vm.BootstrapDataRemoved
}

// Name is the LibvirtMachine's name.
func (s *MachineScope) Name() string { return s.LibvirtMachine.Name }

// Namespace is the LibvirtMachine's namespace.
func (s *MachineScope) Namespace() string { return s.LibvirtMachine.Namespace }

// ClusterName is the Cluster API cluster the machine belongs to.
func (s *MachineScope) ClusterName() string {
	if s.Machine != nil && s.Machine.Spec.ClusterName != "" {
		return s.Machine.Spec.ClusterName
	}
	return s.LibvirtMachine.Labels[clusterv1.ClusterNameLabel]
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
func (s *MachineScope) IsControlPlane() bool { return IsControlPlane(s.Machine, s.LibvirtMachine) }

// IsControlPlane tells whether a machine is a control-plane machine: its
// Machine m or its infrastructure object infra (Cluster API copies the
// Machine's labels to it, and it outlives a deleted Machine) carries
// Cluster API's control-plane label. Either may be nil.
func IsControlPlane(m *clusterv1.Machine, infra metav1.Object) bool {
	if m != nil {
		if _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; ok {
			return true
		}
	}
	if infra == nil {
		return false
	}
	_, ok := infra.GetLabels()[clusterv1.MachineControlPlaneLabel]
	return ok
}

// ClusterInfrastructureProvisioned tells whether the Cluster reports its
// infrastructure provisioned.
func (s *MachineScope) ClusterInfrastructureProvisioned() bool {
	return s.Cluster != nil && ptr.Deref(s.Cluster.Status.Initialization.InfrastructureProvisioned, false)
}

// network is the machine's network: the one recorded on the
// LibvirtMachine once something was created on it, else spec.network,
// else the LibvirtCluster's status.network. Zero when none is known yet.
func (s *MachineScope) network() NetworkRef {
	if recorded := ParseNetworkRef(s.LibvirtMachine.Annotations[NetworkAnnotation]); !recorded.IsZero() {
		return recorded
	}
	if o := s.LibvirtMachine.Spec.Network; o != nil && (o.Name != "" || o.Bridge != "") {
		return NetworkRef{Name: o.Name, Bridge: o.Bridge}
	}
	if s.LibvirtCluster != nil {
		return statusNetwork(s.LibvirtCluster)
	}
	return NetworkRef{}
}

// diskSizeBytes is a root disk of gib GiB, the default when zero.
func diskSizeBytes(gib int32) uint64 {
	if gib == 0 {
		gib = infrav1.DefaultDiskSizeGiB
	}
	return uint64(gib) << 30
}

// dataDisks are the VM's data disks of spec, those without a pool in
// vmPool.
func dataDisks(spec []infrav1.DataDisk, vmPool string) []DataDisk {
	var out []DataDisk
	for _, d := range spec {
		pool := d.Pool
		if pool == "" {
			pool = vmPool
		}
		out = append(out, DataDisk{Name: d.Name, Pool: pool, SizeBytes: uint64(d.SizeGiB) << 30})
	}
	return out
}

// hostDevices are the aliases spec names, in order.
func hostDevices(spec []infrav1.HostDevice) []string {
	var out []string
	for _, d := range spec {
		out = append(out, d.Name)
	}
	return out
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

// Spec is the machine's spec.
func (s *MachineScope) Spec() *infrav1.LibvirtMachineSpec { return &s.LibvirtMachine.Spec }

// Object is the LibvirtMachine.
func (s *MachineScope) Object() *infrav1.LibvirtMachine { return s.LibvirtMachine }

// IsProvisioned tells whether the machine was ever reported provisioned.
func (s *MachineScope) IsProvisioned() bool {
	return s.LibvirtMachine.Status.Initialization.IsProvisioned()
}

// SetProvisioned reports the machine provisioned, in both contract forms;
// it is never reset.
func (s *MachineScope) SetProvisioned() {
	if !s.IsProvisioned() {
		s.Event(corev1.EventTypeNormal, "Provisioned", "Machine infrastructure is provisioned")
		if s.reached != nil {
			s.reached(metrics.ProvisionedStep)
		}
	}
	s.LibvirtMachine.Status.Initialization.Provisioned = ptr.To(true)
	s.LibvirtMachine.Status.Ready = true
	s.VM.Provisioned = true
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

// addressPools are the IPAM pools of a machine's network attachment.
func addressPools(n *infrav1.NetworkAttachment) []infrav1.IPPoolReference {
	if n == nil {
		return nil
	}
	return n.AddressesFromPools
}

// nameservers are the DNS servers of a machine's network attachment.
func nameservers(n *infrav1.NetworkAttachment) []string {
	if n == nil {
		return nil
	}
	return n.Nameservers
}
