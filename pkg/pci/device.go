package pci

import (
	"fmt"
	"strconv"
	"strings"
)

// IDs are a PCI function's vendor and device IDs, as lspci -nn prints
// them ([10de:2204]); zero when unknown or not asked for.
type IDs struct {
	Vendor, Device uint16
}

// String is the IDs as lspci -nn prints them, without brackets.
func (i IDs) String() string { return fmt.Sprintf("%04x:%04x", i.Vendor, i.Device) }

// ParseID reads one 16-bit ID in hex, with or without 0x (10de, 0x10de),
// as lspci -nn and libvirt's node device XML print it.
func ParseID(s string) (uint16, error) {
	h := strings.TrimPrefix(strings.ToLower(s), "0x")
	if len(h) == 0 || len(h) > 4 {
		return 0, fmt.Errorf("%q is not a PCI ID of up to 4 hex digits such as 10de", s)
	}
	v, err := strconv.ParseUint(h, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("%q is not a PCI ID of up to 4 hex digits such as 10de", s)
	}
	return uint16(v), nil
}

// Class is a PCI function's class code: base class, subclass and
// programming interface (0x030000 is a VGA controller).
type Class uint32

// ParseClass reads a class code as libvirt's node device XML prints it
// (0x020000).
func ParseClass(s string) (Class, error) {
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 24)
	if err != nil {
		return 0, fmt.Errorf("%q is not a PCI class code such as 0x030000", s)
	}
	return Class(v), nil
}

// String is the class code as libvirt prints it.
func (c Class) String() string { return fmt.Sprintf("0x%06x", uint32(c)) }

// Kind is a family of PCI classes that the provider passes through only
// when the operator allows it by name: devices a host needs for itself.
type Kind string

const (
	// KindStorage is base class 0x01: disk controllers (SATA, NVMe,
	// RAID, virtio-blk), through which a guest would reach the host's
	// disks by DMA.
	KindStorage Kind = "storage"
	// KindNetwork is base class 0x02: NICs, the host's own network.
	KindNetwork Kind = "network"
	// KindBridge is base class 0x06: host, ISA and PCI-to-PCI bridges,
	// behind which the host's other devices sit.
	KindBridge Kind = "bridge"
)

// Kinds are every Kind, in the order they are documented.
var Kinds = []Kind{KindStorage, KindNetwork, KindBridge}

// Kind is the family of c that needs the operator's leave, "" for a
// class that needs none (a GPU's 0x03, for one).
func (c Class) Kind() Kind {
	switch c >> 16 {
	case 0x01:
		return KindStorage
	case 0x02:
		return KindNetwork
	case 0x06:
		return KindBridge
	}
	return ""
}

// IsPCIBridge tells whether c is a PCI-to-PCI bridge (0x0604xx), such as
// a PCIe root port, which the kernel's VFIO lets share a device's IOMMU
// group while bound to its port driver.
func (c Class) IsPCIBridge() bool { return c>>8 == 0x0604 }
