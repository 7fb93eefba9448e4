package virt

import (
	"context"
	"fmt"
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
	// IDs and Class are what the device is, as the host reads them from
	// its configuration space: the operator's alias is checked against
	// them before passthrough.
	IDs   pci.IDs
	Class pci.Class
	// IOMMUGroup is the device's IOMMU group, which VFIO hands a guest
	// whole; nil when the host reports none (no IOMMU, or it is off).
	IOMMUGroup *IOMMUGroup
	// Domains are the domains defined on the host that pass the device
	// through, running or not.
	Domains []PCIDeviceUser
}

// IOMMUGroup is an IOMMU group of a host: devices that can reach each
// other's memory, which VFIO isolates only together.
type IOMMUGroup struct {
	Number int
	// Others are the group's devices besides the one asked about.
	Others []PCIGroupMember
}

// PCIGroupMember is another device of an IOMMU group.
type PCIGroupMember struct {
	Address pci.Address
	// Driver is the kernel driver bound to it now, "" for none.
	Driver string
	// Class is its class code; zero when the host does not list it.
	Class pci.Class
	// Unknown is set when the host lists the member in the group but has
	// no node device for it.
	Unknown bool
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
		if err := readPCICapability(conn, nd, addr, &info); err != nil {
			return err
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

// readPCICapability fills in info's IDs, class and IOMMU group from nd's
// PCI capability, and reads each other member of the group's driver.
func readPCICapability(conn *libvirt.Connect, nd *libvirtxml.NodeDevice, addr pci.Address, info *PCIDeviceInfo) error {
	capa := pciCapability(nd)
	if capa == nil {
		return fmt.Errorf("node device %s has no PCI capability", addr.NodeDeviceName())
	}
	var err error
	if info.IDs, info.Class, err = pciIdentity(capa); err != nil {
		return fmt.Errorf("node device %s: %w", addr.NodeDeviceName(), err)
	}
	if capa.IOMMUGroup == nil {
		return nil
	}
	info.IOMMUGroup = &IOMMUGroup{Number: capa.IOMMUGroup.Number}
	for _, a := range capa.IOMMUGroup.Address {
		member, ok := nodeDevicePCIAddress(a)
		if !ok {
			return fmt.Errorf("node device %s: an incomplete address in IOMMU group %d", addr.NodeDeviceName(), capa.IOMMUGroup.Number)
		}
		if member == addr {
			continue
		}
		m, err := groupMember(conn, member)
		if err != nil {
			return err
		}
		info.IOMMUGroup.Others = append(info.IOMMUGroup.Others, m)
	}
	return nil
}

// groupMember reads the driver and class of the host's device at addr.
func groupMember(conn *libvirt.Connect, addr pci.Address) (PCIGroupMember, error) {
	m := PCIGroupMember{Address: addr}
	dev, err := conn.LookupDeviceByName(addr.NodeDeviceName())
	if IsNotFound(err) {
		m.Unknown = true
		return m, nil
	}
	if err != nil {
		return m, err
	}
	defer func() { _ = dev.Free() }()
	nd, err := decodeXML[libvirtxml.NodeDevice](dev.GetXMLDesc(0))
	if err != nil {
		return m, err
	}
	if nd.Driver != nil {
		m.Driver = nd.Driver.Name
	}
	if capa := pciCapability(nd); capa != nil {
		_, m.Class, _ = pciIdentity(capa) // a member's class only relaxes the check
	}
	return m, nil
}

// pciCapability is nd's PCI capability, nil when it has none.
func pciCapability(nd *libvirtxml.NodeDevice) *libvirtxml.NodeDevicePCICapability {
	return nd.Capability.PCI
}

// pciIdentity reads the IDs and the class code of a PCI capability.
func pciIdentity(capa *libvirtxml.NodeDevicePCICapability) (pci.IDs, pci.Class, error) {
	var ids pci.IDs
	var err error
	if ids.Vendor, err = pci.ParseID(capa.Vendor.ID); err != nil {
		return ids, 0, fmt.Errorf("vendor: %w", err)
	}
	if ids.Device, err = pci.ParseID(capa.Product.ID); err != nil {
		return ids, 0, fmt.Errorf("product: %w", err)
	}
	class, err := pci.ParseClass(capa.Class)
	return ids, class, err
}

// nodeDevicePCIAddress reads an IOMMU group member's address.
func nodeDevicePCIAddress(a libvirtxml.NodeDevicePCIAddress) (pci.Address, bool) {
	if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
		return pci.Address{}, false
	}
	return pci.Address{Domain: uint16(*a.Domain), Bus: uint8(*a.Bus), Slot: uint8(*a.Slot), Function: uint8(*a.Function)}, true
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

// pciHostdevs counts the PCI devices domain d passes through.
func pciHostdevs(d *libvirtxml.Domain) int {
	if d.Devices == nil {
		return 0
	}
	n := 0
	for _, h := range d.Devices.Hostdevs {
		if h.SubsysPCI != nil {
			n++
		}
	}
	return n
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
