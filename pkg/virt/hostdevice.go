package virt

import (
	"context"
	"slices"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

// PCIDeviceInfo is what a host says of one of its PCI devices.
type PCIDeviceInfo struct {
	// Driver is the kernel driver bound to the device now: the host's
	// own (nvidia, ixgbe, ...) until libvirt detaches it for a domain,
	// vfio-pci while one runs with it.
	Driver string
	// Domains are the domains defined on the host that pass the device
	// through, running or not.
	Domains []PCIDeviceUser
}

// PCIDeviceUser is a domain that passes a PCI device through.
type PCIDeviceUser struct {
	Name string
	// Active is true while the domain runs: it holds the device, and
	// libvirt refuses to start another domain with it.
	Active bool
}

// HeldByOther is the running domain other than domain that holds the
// device, "" when none does: the device is free for domain.
func (i PCIDeviceInfo) HeldByOther(domain string) string {
	if j := slices.IndexFunc(i.Domains, func(u PCIDeviceUser) bool { return u.Active && u.Name != domain }); j >= 0 {
		return i.Domains[j].Name
	}
	return ""
}

// PCIDevice describes the host's PCI device at addr and the domains that
// pass it through; IsNotFound(err) when the host has no such device.
// Every domain of the host counts, ours or not: a device another program's
// domain holds is not free either.
func (c *Client) PCIDevice(ctx context.Context, addr pci.Address) (PCIDeviceInfo, error) {
	var info PCIDeviceInfo
	err := c.withConn(ctx, "PCIDevice", func(conn *libvirt.Connect) error {
		dev, err := conn.LookupDeviceByName(addr.NodeDeviceName())
		if err != nil {
			return err
		}
		defer func() { _ = dev.Free() }()
		nd, err := decodeXML[libvirtxml.NodeDevice](dev.GetXMLDesc(0))
		if err != nil {
			return err
		}
		if nd.Driver != nil {
			info.Driver = nd.Driver.Name
		}
		domains, err := conn.ListAllDomains(0)
		if err != nil {
			return err
		}
		defer func() {
			for i := range domains {
				_ = domains[i].Free()
			}
		}()
		for i := range domains {
			// The live definition: what a running domain holds now,
			// hot-plugged devices included; a stopped domain's own.
			d, err := decodeXML[libvirtxml.Domain](domains[i].GetXMLDesc(0))
			if IsNotFound(err) {
				continue // undefined since it was listed
			}
			if err != nil {
				return err
			}
			if !passesThrough(d, addr) {
				continue
			}
			active, err := domains[i].IsActive()
			if err != nil && !IsNotFound(err) {
				return err
			}
			info.Domains = append(info.Domains, PCIDeviceUser{Name: d.Name, Active: active})
		}
		return nil
	})
	return info, err
}

// passesThrough tells whether domain d has a PCI hostdev at addr.
func passesThrough(d *libvirtxml.Domain, addr pci.Address) bool {
	if d.Devices == nil {
		return false
	}
	for _, h := range d.Devices.Hostdevs {
		if h.SubsysPCI == nil || h.SubsysPCI.Source == nil || h.SubsysPCI.Source.Address == nil {
			continue
		}
		if got, ok := pciAddress(h.SubsysPCI.Source.Address); ok && got == addr {
			return true
		}
	}
	return false
}

// pciAddress reads libvirt's address; ok is false when a part is missing.
func pciAddress(a *libvirtxml.DomainAddressPCI) (pci.Address, bool) {
	if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
		return pci.Address{}, false
	}
	return pci.Address{Domain: uint16(*a.Domain), Bus: uint8(*a.Bus), Slot: uint8(*a.Slot), Function: uint8(*a.Function)}, true
}

// hostdevXML is a managed VFIO passthrough of addr: libvirt detaches the
// device from its host driver when the domain starts and gives it back
// when it stops, so the operator binds nothing by hand.
func hostdevXML(addr pci.Address) libvirtxml.DomainHostdev {
	domain, bus, slot, function := uint(addr.Domain), uint(addr.Bus), uint(addr.Slot), uint(addr.Function)
	return libvirtxml.DomainHostdev{
		Managed: "yes",
		SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
			Driver: &libvirtxml.DomainHostdevSubsysPCIDriver{Name: "vfio"},
			Source: &libvirtxml.DomainHostdevSubsysPCISource{
				Address: &libvirtxml.DomainAddressPCI{Domain: &domain, Bus: &bus, Slot: &slot, Function: &function},
			},
		},
	}
}
