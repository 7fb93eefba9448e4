// Package hostdevice finds the PCI devices a machine passes through
// (spec.hostDevices) on its host before the domain is defined: each alias
// resolves through the operator's --host-devices to an address, which the
// host must have and no other running domain may hold. The devices belong
// to the domain; nothing is created for them, and nothing is left to
// delete when the domain goes (libvirt gives a managed device back to its
// host driver when the domain stops).
package hostdevice

import (
	"context"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Recheck is how often a machine whose device is missing or taken looks
// again: a domain that releases a device announces nothing the machine
// watches.
const Recheck = time.Minute

// Service resolves the VM's host devices; its failures are DomainReady's.
type Service struct {
	vm     *scope.VM
	host   virt.DomainHost
	policy tenancy.Policy
}

var _ services.Service = (*Service)(nil)

// New returns the host device step of vm on host under policy.
func New(vm *scope.VM, host virt.DomainHost, policy tenancy.Policy) *Service {
	return &Service{vm: vm, host: host, policy: policy}
}

func (*Service) Name() string { return "host devices" }

// Reconcile hands the devices' addresses, in spec order, to the domain
// step of the same reconcile, or waits while one is missing or taken. Two
// machines may both find a device free and both be defined with it:
// libvirt then starts only one, and the other finds it held here next
// time.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	addresses := make([]pci.Address, 0, len(vm.HostDevices))
	for _, alias := range vm.HostDevices {
		dev, err := svc.policy.HostDevice(alias)
		if err != nil { // the reference step refuses it first
			return services.Result{}, services.Fail(infrav1.HostDeviceNotAllowedReason, err, "Host device %q %v", alias, err)
		}
		state, err := Check(ctx, svc.host, dev, vm.Domain)
		if err != nil {
			return services.Result{}, err
		}
		if state != "" {
			return services.Result{}, services.Fail(infrav1.WaitingForHostDeviceReason, services.Requeue(Recheck, "host device"),
				"Host device %s: %s on host %s", alias, state, vm.Host)
		}
		addresses = append(addresses, dev.Address)
	}
	vm.PCIDevices = addresses
	return services.Result{}, nil
}

// Check tells why dev cannot go to domain on host ("" when it is free):
// the host has no such device, or another running domain holds it.
func Check(ctx context.Context, host virt.DomainHost, dev tenancy.HostDevice, domain string) (string, error) {
	info, err := host.PCIDevice(ctx, dev.Address)
	if virt.IsNotFound(err) {
		return "PCI device " + dev.Address.String() + " does not exist", nil
	}
	if err != nil {
		return "", services.Fail(infrav1.LibvirtErrorReason, err, "Looking up PCI device %s: %v", dev.Address, err)
	}
	if other := info.HeldByOther(domain); other != "" {
		return "PCI device " + dev.Address.String() + " is held by the running domain " + other, nil
	}
	return "", nil
}

// Delete has nothing to do: the devices go with the domain.
func (*Service) Delete(context.Context) error { return nil }
