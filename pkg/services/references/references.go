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

// refused reports a reference refused on condType, the condition of the
// step that would use it, and stops the reconcile until the object or the
// policy changes: the references are immutable or the user's to edit, and
// a policy change restarts the manager, which reconciles everything again.
func refused(what, condType, reason, format string, args ...any) error {
	return services.FailOn(condType, reason, services.Requeue(0, what+" not allowed"), format, args...)
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

// Reconcile refuses the machine, with DiskReady or AddressReserved False,
// when it names what its namespace may not use; it runs before any step
// creates something.
func (m *Machine) Reconcile(ctx context.Context) (services.Result, error) {
	s, vm, p := m.scope, m.vm, m.policy
	pool := vm.Pool
	if f, err := p.CheckPool(pool.Name, pool.Path); err != nil {
		return services.Result{}, refused("storage pool", infrav1.DiskReadyCondition, infrav1.StoragePoolNotAllowedReason,
			"Storage pool %s %q %v", f, poolField(pool.Name, pool.Path, f), err)
	}
	for i, d := range s.Spec().DataDisks {
		if err := p.CheckPoolName(d.Pool); d.Pool != "" && err != nil {
			return services.Result{}, refused("storage pool", infrav1.DiskReadyCondition, infrav1.StoragePoolNotAllowedReason,
				"spec.dataDisks[%d].pool %q %v", i, d.Pool, err)
		}
	}
	if err := checkNetwork(p, s.Namespace(), vm.Network); err != nil {
		return services.Result{}, refused("network", infrav1.AddressReservedCondition, infrav1.NetworkNotAllowedReason,
			"%s %v", describe(vm.Network), err)
	}
	for i, ref := range vm.AddressPools {
		if err := p.CheckIPPool(s.Namespace(), ref); err != nil {
			return services.Result{}, refused("IPAM pool", infrav1.AddressReservedCondition, infrav1.IPPoolNotAllowedReason,
				"spec.network.addressesFromPools[%d] %v", i, err)
		}
	}
	if v := vm.Image.Volume; v != nil {
		if f, err := p.CheckImageVolume(*v, pool.Name); err != nil {
			return services.Result{}, refused("image", infrav1.DiskReadyCondition, infrav1.ImageNotAllowedReason,
				"spec.image.volume.%s %q %v", f, volumeField(*v, f), err)
		}
	}
	if err := p.CheckImageURL(vm.Image.URL); err != nil {
		return services.Result{}, refused("image", infrav1.DiskReadyCondition, infrav1.ImageNotAllowedReason,
			"spec.image.url %q %v", virt.RedactURL(vm.Image.URL), err)
	}
	for i, d := range s.Spec().HostDevices {
		if _, err := p.HostDevice(d.Name); err != nil {
			return services.Result{}, refused("host device", infrav1.DomainReadyCondition, infrav1.HostDeviceNotAllowedReason,
				"spec.hostDevices[%d].name %q %v", i, d.Name, err)
		}
	}
	if exceeded := p.Machine.Exceeded(tenancy.MachineUsage(s.Spec()), "--max-machine-"); len(exceeded) > 0 {
		return services.Result{}, refused("machine size", infrav1.DomainReadyCondition, infrav1.MachineSizeNotAllowedReason,
			"%s", describeExceeded(exceeded))
	}
	return services.Result{}, m.checkQuota(ctx)
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
// HAProxy VM. Every refusal is reported, not only the first.
func (c *Cluster) Reconcile(ctx context.Context) (services.Result, error) {
	s, p := c.scope, c.policy
	var refusals []error
	spec := s.SpecPool()
	if f, perr := p.CheckPool(spec.Name, spec.Path); perr != nil {
		refusals = append(refusals, refused("storage pool", infrav1.StoragePoolReadyCondition, infrav1.StoragePoolNotAllowedReason,
			"spec.storagePool.%s %q %v", f, poolField(spec.Name, spec.Path, f), perr))
	} else if recorded := s.Pool().Name; recorded != spec.Name {
		if perr := p.CheckPoolName(recorded); perr != nil {
			refusals = append(refusals, refused("storage pool", infrav1.StoragePoolReadyCondition, infrav1.StoragePoolNotAllowedReason,
				"Annotation %s %q %v", scope.PoolAnnotation, recorded, perr))
		}
	}
	ns := s.NetworkSpec()
	n := scope.NetworkRef{Name: ns.Name, Bridge: ns.Bridge}
	if nerr := checkNetwork(p, s.Namespace(), n); nerr != nil {
		refusals = append(refusals, refused("network", infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason,
			"%s %v", describe(n), nerr))
	}
	if cerr := p.CheckClusterNetworkCIDR(ns); cerr != nil {
		refusals = append(refusals, refused("network range", infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason,
			"spec.network.cidr %q %v", ns.CIDR, cerr))
	}
	if s.LoadBalancerEnabled() {
		if v := s.LoadBalancerImage().Volume; v != nil {
			if f, ierr := p.CheckImageVolume(*v, s.Pool().Name); ierr != nil {
				refusals = append(refusals, refused("load balancer image", infrav1.LoadBalancerReadyCondition, infrav1.ImageNotAllowedReason,
					"spec.loadBalancer.image.volume.%s %q %v", f, volumeField(*v, f), ierr))
			}
		}
		u := s.LoadBalancerImage().URL
		if uerr := p.CheckImageURL(u); uerr != nil {
			refusals = append(refusals, refused("load balancer image", infrav1.LoadBalancerReadyCondition, infrav1.ImageNotAllowedReason,
				"spec.loadBalancer.image.url %q %v", virt.RedactURL(u), uerr))
		}
		if ref := s.Object().Spec.LoadBalancer.AddressFromPool; ref != nil {
			if perr := p.CheckIPPool(s.Namespace(), *ref); perr != nil {
				refusals = append(refusals, refused("IPAM pool", infrav1.LoadBalancerReadyCondition, infrav1.IPPoolNotAllowedReason,
					"spec.loadBalancer.addressFromPool %v", perr))
			}
		}
		if exceeded := p.Machine.Exceeded(tenancy.LoadBalancerUsage(&s.Object().Spec), "--max-machine-"); len(exceeded) > 0 {
			refusals = append(refusals, refused("load balancer size", infrav1.LoadBalancerReadyCondition, infrav1.MachineSizeNotAllowedReason,
				"HAProxy VM: %s", describeExceeded(exceeded)))
		}
	}
	if len(refusals) > 0 {
		return services.Result{}, errors.Join(refusals...)
	}
	return services.Result{}, c.admit(ctx)
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

func checkNetwork(p tenancy.Policy, namespace string, n scope.NetworkRef) error {
	switch {
	case n.Name != "":
		return p.CheckNetwork(namespace, n.Name)
	case n.Bridge != "":
		return p.CheckBridge(n.Bridge)
	}
	return nil
}

// describe names a network for a condition message.
func describe(n scope.NetworkRef) string {
	if n.Name != "" {
		return fmt.Sprintf("Network %q", n.Name)
	}
	return fmt.Sprintf("Host bridge %q", n.Bridge)
}

func poolField(name, path, field string) string {
	if field == "path" {
		return path
	}
	return name
}

func volumeField(v infrav1.VolumeReference, field string) string {
	if field == "pool" {
		return v.Pool
	}
	return v.Name
}
