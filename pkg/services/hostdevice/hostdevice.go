// Package hostdevice finds the PCI devices a machine passes through
// (spec.hostDevices) on its host before the domain is defined: each alias
// resolves through the operator's --host-devices to an address, which the
// host must have, with the IDs, class and IOMMU group the operator's
// entry allows, and no other running domain may hold. The devices belong
// to the domain; nothing is created for them, and nothing is left to
// delete when the domain goes (libvirt gives a managed device back to its
// host driver when the domain stops).
package hostdevice

import (
	"context"
	"fmt"
	"slices"
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
	// devices are what the last Reconcile found free.
	devices []pci.Address
}

var _ services.Service = (*Service)(nil)

// New returns the host device step of vm on host under policy.
func New(vm *scope.VM, host virt.DomainHost, policy tenancy.Policy) *Service {
	return &Service{vm: vm, host: host, policy: policy}
}

func (*Service) Name() string { return "host devices" }

// Devices are the addresses of the VM's host devices on its host, in
// order, which the last Reconcile found free and the domain step passes
// through; nil when it did not run or stopped.
func (svc *Service) Devices() []pci.Address { return svc.devices }

// Reconcile hands the devices' addresses, in spec order, to the domain
// step of the same reconcile, or stops while one is missing, taken, or
// not what the operator meant. Two machines may both find a device free
// and both be defined with it: libvirt then starts only one, and the
// other finds it held here next time.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.devices = nil
	addresses := make([]pci.Address, 0, len(vm.HostDevices))
	for _, alias := range vm.HostDevices {
		dev, err := svc.policy.HostDevice(alias)
		if err != nil { // the reference step refuses it first
			return services.Result{}, services.Fail(infrav1.HostDeviceNotAllowedReason, err, "Host device %q %v", alias, err)
		}
		problem, err := Check(ctx, svc.host, svc.policy, dev, vm.Host, vm.Domain)
		if err != nil {
			return services.Result{}, err
		}
		if problem != nil {
			// A device is bound or unbound, and a domain releases it,
			// without an event the machine watches: look again.
			return services.Result{}, services.Fail(problem.Reason, services.Requeue(Recheck, "host device"),
				"Host device %s: %s", alias, problem.Message)
		}
		addresses = append(addresses, dev.Address)
	}
	svc.devices = addresses
	return services.Result{}, nil
}

// Problem is why a device cannot go to a domain now, with the condition
// reason that reports it.
type Problem struct {
	Reason, Message string
}

// Check tells why dev cannot go to domain on host, whose name (as
// status.domain.host shows it) is hostName; nil when it can.
func Check(ctx context.Context, host virt.DomainHost, policy tenancy.Policy, dev tenancy.HostDevice, hostName, domain string) (*Problem, error) {
	if !dev.OnHost(hostName) {
		return &Problem{Reason: infrav1.WaitingForHostDeviceReason,
			Message: fmt.Sprintf("the operator's --host-devices binds %s to host %s, not to %s", dev.Alias, dev.Host, hostName)}, nil
	}
	info, err := host.PCIDevice(ctx, dev.Address)
	if virt.IsNotFound(err) {
		return &Problem{Reason: infrav1.WaitingForHostDeviceReason,
			Message: fmt.Sprintf("PCI device %s does not exist on host %s", dev.Address, hostName)}, nil
	}
	if err != nil {
		return nil, services.Fail(infrav1.LibvirtErrorReason, err, "Looking up PCI device %s: %v", dev.Address, err)
	}
	return Judge(policy, dev, hostName, info, domain), nil
}

// passThroughDrivers are the drivers that leave a device to VFIO, not to
// the host: a member of a device's IOMMU group bound to one of them (or
// to none) is no device the host uses.
var passThroughDrivers = []string{"", "vfio-pci", "pci-stub"}

// Judge decides from what host hostName says of the device at dev's
// address (info) whether domain may take it: it must have the IDs the
// operator gave, be of a class the operator allows (disk controllers,
// NICs and bridges only when named in allow=), sit in an IOMMU group
// whose other devices the host does not use (bound to vfio-pci,
// pci-stub or nothing, another device the operator lists for this host,
// or a PCI bridge on its port driver, which VFIO accepts), and no other
// running domain may hold it. Nil when it may.
func Judge(policy tenancy.Policy, dev tenancy.HostDevice, hostName string, info virt.PCIDeviceInfo, domain string) *Problem {
	where := fmt.Sprintf("PCI device %s on host %s", dev.Address, hostName)
	if dev.IDs != (pci.IDs{}) && info.IDs != dev.IDs {
		return &Problem{Reason: infrav1.HostDeviceMismatchReason,
			Message: fmt.Sprintf("%s is %s (vendor:device), not the %s the operator's --host-devices names for %s", where, info.IDs, dev.IDs, dev.Alias)}
	}
	if k := info.Class.Kind(); !dev.Allows(k) {
		return &Problem{Reason: infrav1.HostDeviceNotAllowedReason,
			Message: fmt.Sprintf("%s is a %s device (class %s), which the host may need for itself; the operator's --host-devices allows one only with allow=%s", where, k, info.Class, k)}
	}
	if info.IOMMUGroup == nil {
		return &Problem{Reason: infrav1.HostDeviceNotAllowedReason,
			Message: where + " is in no IOMMU group: the host cannot isolate it (passthrough needs the IOMMU on)"}
	}
	for _, m := range info.IOMMUGroup.Others {
		if usedByHost(policy, hostName, m) {
			driver := m.Driver
			if m.Unknown {
				driver = "unknown to libvirt"
			}
			return &Problem{Reason: infrav1.HostDeviceNotAllowedReason,
				Message: fmt.Sprintf("%s shares IOMMU group %d with %s (driver %s), which the host still uses and the guest could reach", where, info.IOMMUGroup.Number, m.Address, driver)}
		}
	}
	if other := info.HeldByOther(domain); other != "" {
		return &Problem{Reason: infrav1.WaitingForHostDeviceReason, Message: where + " is held by the running domain " + other}
	}
	return nil
}

// usedByHost tells whether m, another device of an IOMMU group, is one
// the host uses: not left to VFIO, not a device the operator lists for
// passthrough on this host, and not a PCI bridge on its port driver.
func usedByHost(policy tenancy.Policy, hostName string, m virt.PCIGroupMember) bool {
	switch {
	case m.Unknown:
		return true
	case slices.Contains(passThroughDrivers, m.Driver):
		return false
	case m.Class.IsPCIBridge() && m.Driver == "pcieport":
		return false
	}
	return !slices.ContainsFunc(policy.HostDevices, func(d tenancy.HostDevice) bool { return d.Address == m.Address && d.OnHost(hostName) })
}

// Delete has nothing to do: the devices go with the domain.
func (*Service) Delete(context.Context) error { return nil }
