// Package references refuses, before anything is created in libvirt, what
// a LibvirtMachine or LibvirtCluster names outside what its namespace may
// use (pkg/tenancy): another namespace's root disks, seeds and networks,
// pools and bridges the operator did not allow. The webhooks refuse the
// same on admission; this step covers objects they never saw (webhook
// absent, failing open, or bypassed) and values that do not come from the
// spec (the placement annotations, the cluster's status.network).
package references

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// refusal is how a check reports one tenancy.Refusal: the condition of
// the step that would use what is refused, what that is (for the wait's
// reason), and the message, subject then detail.
type refusal struct {
	condType, what, subject, detail string
}

// refused reports refusals, each on the condition of the step that would
// use what it refuses, and stops the reconcile until the object or the
// policy changes: the references are immutable or the user's to edit, and
// a policy change restarts the manager, which reconciles everything again.
// Refusals on one condition share it, in the order found, with the first
// one's reason; consecutive ones about the same subject (a VM's sizes)
// name it once.
func refused(refusals []tenancy.Refusal, describe func(tenancy.Refusal) refusal) error {
	type onCondition struct {
		condType, reason, what, subject string
		message                         strings.Builder
	}
	var order []*onCondition
	for _, rf := range refusals {
		d := describe(rf)
		i := slices.IndexFunc(order, func(c *onCondition) bool { return c.condType == d.condType })
		if i < 0 {
			order = append(order, &onCondition{condType: d.condType, reason: rf.Reason, what: d.what})
			i = len(order) - 1
		}
		c := order[i]
		part := strings.TrimPrefix(d.subject+" "+d.detail, " ")
		if c.message.Len() > 0 {
			if d.subject == c.subject {
				part = d.detail
			}
			c.message.WriteString("; ")
		}
		c.subject = d.subject
		c.message.WriteString(part)
	}
	errs := make([]error, len(order))
	for i, c := range order {
		errs[i] = services.FailOn(c.condType, c.reason, services.Requeue(0, c.what+" not allowed"), "%s", c.message.String())
	}
	return errors.Join(errs...)
}

// MachineScope is what the check needs of a machine: what it names, what
// it asks for, and what the namespace's machines created before it ask for.
type MachineScope interface {
	Namespace() string
	// Spec is the machine's spec, defaulted.
	Spec() *infrav1.LibvirtMachineSpec
	// Object is the LibvirtMachine.
	Object() *infrav1.LibvirtMachine
}

// Admitter admits objects within their namespace's totals (quota.Ledger).
type Admitter interface {
	Admit(ctx context.Context, r quota.Request) error
}

// Machine checks a LibvirtMachine's pool, network and base image, and
// admits it within its namespace's totals.
type Machine struct {
	scope  MachineScope
	vm     *scope.VM
	policy tenancy.Policy
	quota  Admitter
}

// NewMachine returns the reference check of machine s, whose VM is vm,
// under policy; q (nil for none) admits it within its namespace's totals.
func NewMachine(s MachineScope, vm *scope.VM, policy tenancy.Policy, q Admitter) *Machine {
	return &Machine{scope: s, vm: vm, policy: policy, quota: q}
}

func (*Machine) Name() string { return "references" }

// Reconcile refuses the machine, with DiskReady, AddressReserved or
// DomainReady False, when it names what its namespace may not use or is
// larger than one machine may be; it runs before any step creates
// something. Every refusal is reported, not only the first. It checks
// where the placement resolved to (the recorded annotations, the spec,
// the cluster's pool and network), which the webhook cannot know.
func (m *Machine) Reconcile(ctx context.Context) (services.Result, error) {
	s, vm := m.scope, m.vm
	refs := tenancy.MachineRefsOf(s.Spec(), vm.Pool.Name)
	// Where the placement resolved to: the recorded or the cluster's.
	refs.Pool = tenancy.Pool{Name: vm.Pool.Name, Path: vm.Pool.Path}
	refs.Network, refs.AddressPools = tenancy.Network{Name: vm.Network.Name, Bridge: vm.Network.Bridge}, vm.AddressPools
	refs.Image = tenancy.Image{Volume: vm.Image.Volume, DefaultPool: vm.Pool.Name, URL: vm.Image.URL}
	if refusals := m.policy.CheckMachine(s.Namespace(), refs); len(refusals) > 0 {
		return services.Result{}, refused(refusals, describeMachine)
	}
	return services.Result{}, m.checkQuota(ctx)
}

// describeMachine is how a machine reports rf: on the condition of the
// step that would use what it refuses.
func describeMachine(rf tenancy.Refusal) refusal {
	switch rf.Part {
	case tenancy.PartPool:
		return refusal{infrav1.DiskReadyCondition, "storage pool", fmt.Sprintf("Storage pool %s %q", rf.Field, rf.Value), rf.Message}
	case tenancy.PartDataDiskPool:
		return refusal{infrav1.DiskReadyCondition, "storage pool", fmt.Sprintf("spec.dataDisks[%d].pool %q", rf.Index, rf.Value), rf.Message}
	case tenancy.PartNetwork:
		return refusal{infrav1.AddressReservedCondition, "network", describeNetwork(rf), rf.Message}
	case tenancy.PartIPAMPool:
		return refusal{infrav1.AddressReservedCondition, "IPAM pool", fmt.Sprintf("spec.network.addressesFromPools[%d]", rf.Index), rf.Message}
	case tenancy.PartImageVolume:
		return refusal{infrav1.DiskReadyCondition, "image", fmt.Sprintf("spec.image.volume.%s %q", rf.Field, rf.Value), rf.Message}
	case tenancy.PartImageURL:
		return refusal{infrav1.DiskReadyCondition, "image", fmt.Sprintf("spec.image.url %q", virt.RedactURL(rf.Value)), rf.Message}
	case tenancy.PartHostDevice:
		return refusal{infrav1.DomainReadyCondition, "host device", fmt.Sprintf("spec.hostDevices[%d].name %q", rf.Index, rf.Value), rf.Message}
	case tenancy.PartSize:
		return refusal{infrav1.DomainReadyCondition, "machine size", "", rf.Field + " " + rf.Message}
	case tenancy.PartRecordedNetwork:
		return refusal{infrav1.AddressReservedCondition, "network", fmt.Sprintf("Annotation %s %q", scope.NetworkAnnotation, rf.Value), rf.Message}
	}
	return refusal{infrav1.DiskReadyCondition, "storage pool", fmt.Sprintf("Annotation %s %q", scope.PoolAnnotation, rf.Value), rf.Message}
}

// checkQuota admits the machine when what its namespace holds on the
// hosts, what the namespace's objects created before it ask for and what
// it asks for stay within the namespace's totals. Counting only those
// ahead, in creation order, lets the first machines in: counting all
// would have every machine of a namespace one over its quota wait.
func (m *Machine) checkQuota(ctx context.Context) error {
	if m.quota == nil {
		return nil
	}
	domain := m.vm.Domain
	lm := m.scope.Object().DeepCopy()
	lm.Spec = *m.scope.Spec()
	err := m.quota.Admit(ctx, quota.Request{
		Object: lm,
		Own:    func(o virt.OwnedObject) bool { return quota.OfDomain(domain, o) },
		Ask:    func(h quota.Holdings) tenancy.Usage { return quota.MachineAsk(lm, h) },
	})
	return quotaOutcome(err, infrav1.DomainReadyCondition)
}

// quotaOutcome reports a refusal for the namespace's totals on condType,
// looked at again later: what frees room says nothing to the object.
func quotaOutcome(err error, condType string) error {
	var exceeded *quota.ExceededError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exceeded):
		return services.FailOn(condType, infrav1.NamespaceQuotaExceededReason, services.Requeue(quota.Recheck, "namespace quota"),
			"Namespace %s with this object: %s", exceeded.Namespace, describeExceeded(exceeded.Exceeded))
	default:
		return fmt.Errorf("counting the namespace's holdings: %w", err)
	}
}

// ClusterScope is what the check needs of a cluster: what it names.
type ClusterScope interface {
	Namespace() string
	// SpecPool is the pool the spec names, Pool the one the HAProxy VM's
	// volumes were placed in (recorded), which may differ.
	SpecPool() virt.PoolSpec
	Pool() virt.PoolSpec
	NetworkSpec() infrav1.ClusterNetwork
	LoadBalancerEnabled() bool
	LoadBalancerImage() infrav1.ImageSource
	// Object is the LibvirtCluster.
	Object() *infrav1.LibvirtCluster
}

// Cluster checks a LibvirtCluster's pool, network, HAProxy image and
// HAProxy VM size, and admits it within its namespace's totals.
type Cluster struct {
	scope  ClusterScope
	policy tenancy.Policy
	quota  Admitter
}

// NewCluster returns the reference check of s under policy; q (nil for
// none) admits it within its namespace's totals.
func NewCluster(s ClusterScope, policy tenancy.Policy, q Admitter) *Cluster {
	return &Cluster{scope: s, policy: policy, quota: q}
}

func (*Cluster) Name() string { return "references" }

// Reconcile refuses the cluster, with StoragePoolReady, NetworkReady or
// LoadBalancerReady False, when it names what its namespace may not use;
// it runs before the steps that create the pool, the network and the
// HAProxy VM. Every refusal is reported, not only the first. The HAProxy
// VM's image goes in the pool its volumes were placed in, which may not
// be the spec's.
func (c *Cluster) Reconcile(ctx context.Context) (services.Result, error) {
	s := c.scope
	spec := s.SpecPool()
	refs := tenancy.ClusterRefs{Pool: tenancy.Pool{Name: spec.Name, Path: spec.Path}, Network: s.NetworkSpec()}
	if recorded := s.Pool().Name; recorded != spec.Name {
		refs.Recorded.Pool = recorded
	}
	if s.LoadBalancerEnabled() {
		img := s.LoadBalancerImage()
		refs.LoadBalancer = &tenancy.LoadBalancerRefs{
			Image:       tenancy.Image{Volume: img.Volume, DefaultPool: s.Pool().Name, URL: img.URL},
			Usage:       tenancy.LoadBalancerUsage(&s.Object().Spec),
			AddressPool: s.Object().Spec.LoadBalancer.AddressFromPool,
		}
	}
	if refusals := c.policy.CheckCluster(s.Namespace(), refs); len(refusals) > 0 {
		return services.Result{}, refused(refusals, describeCluster)
	}
	return services.Result{}, c.admit(ctx)
}

// describeCluster is how a cluster reports rf: on the condition of the
// step that would use what it refuses.
func describeCluster(rf tenancy.Refusal) refusal {
	const lb = infrav1.LoadBalancerReadyCondition
	switch rf.Part {
	case tenancy.PartPool:
		return refusal{infrav1.StoragePoolReadyCondition, "storage pool", fmt.Sprintf("spec.storagePool.%s %q", rf.Field, rf.Value), rf.Message}
	case tenancy.PartNetwork:
		return refusal{infrav1.NetworkReadyCondition, "network", describeNetwork(rf), rf.Message}
	case tenancy.PartNetworkCIDR:
		return refusal{infrav1.NetworkReadyCondition, "network range", fmt.Sprintf("spec.network.cidr %q", rf.Value), rf.Message}
	case tenancy.PartImageVolume:
		return refusal{lb, "load balancer image", fmt.Sprintf("spec.loadBalancer.image.volume.%s %q", rf.Field, rf.Value), rf.Message}
	case tenancy.PartImageURL:
		return refusal{lb, "load balancer image", fmt.Sprintf("spec.loadBalancer.image.url %q", virt.RedactURL(rf.Value)), rf.Message}
	case tenancy.PartIPAMPool:
		return refusal{lb, "IPAM pool", "spec.loadBalancer.addressFromPool", rf.Message}
	case tenancy.PartSize:
		return refusal{lb, "load balancer size", "HAProxy VM:", rf.Field + " " + rf.Message}
	case tenancy.PartRecordedNetwork:
		return refusal{infrav1.NetworkReadyCondition, "network", fmt.Sprintf("Annotation %s %q", scope.NetworkAnnotation, rf.Value), rf.Message}
	}
	return refusal{infrav1.StoragePoolReadyCondition, "storage pool", fmt.Sprintf("Annotation %s %q", scope.PoolAnnotation, rf.Value), rf.Message}
}

// admit admits the cluster, its network and HAProxy VM, within its
// namespace's totals; refused, nothing of it is created.
func (c *Cluster) admit(ctx context.Context) error {
	if c.quota == nil {
		return nil
	}
	lc := c.scope.Object()
	network := naming.ClusterNetworkName(lc.Namespace, lc.Name)
	lb := naming.LoadBalancerDomainName(lc.Namespace, lc.Name)
	err := c.quota.Admit(ctx, quota.Request{
		Object: lc,
		Own: func(o virt.OwnedObject) bool {
			return (o.Kind == virt.OwnedNetwork && o.Name == network) || quota.OfDomain(lb, o)
		},
		Ask: func(h quota.Holdings) tenancy.Usage { return quota.ClusterAsk(lc, h) },
	})
	return quotaOutcome(err, infrav1.NetworkReadyCondition)
}

// describeExceeded lists the limits passed, by field.
func describeExceeded(exceeded map[string]string) string {
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(exceeded)) {
		parts = append(parts, f+" "+exceeded[f])
	}
	return strings.Join(parts, "; ")
}

// Delete does nothing: the check creates nothing.
func (*Cluster) Delete(context.Context) error { return nil }

// Delete does nothing: the check creates nothing.
func (*Machine) Delete(context.Context) error { return nil }

// describeNetwork names a refused network for a condition message.
func describeNetwork(rf tenancy.Refusal) string {
	if rf.Field == "bridge" {
		return fmt.Sprintf("Host bridge %q", rf.Value)
	}
	return fmt.Sprintf("Network %q", rf.Value)
}
