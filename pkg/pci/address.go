// Package pci names a host's PCI devices by their address, the form the
// operator lists them in (--host-devices) and libvirt passes them through
// by. It is pure: pkg/tenancy parses the operator's list with it and
// pkg/virt turns an address into a domain's hostdev.
package pci

import (
	"fmt"
	"regexp"
	"strconv"
)

// Address is a PCI function's address: domain, bus, slot (device) and
// function, as lspci -D prints it (0000:65:00.0).
type Address struct {
	Domain   uint16
	Bus      uint8
	Slot     uint8
	Function uint8
}

// addressPattern is lspci -D's form, the domain optional (0000 when left
// out, as lspci without -D prints it). The slot has 5 bits, the function 3.
var addressPattern = regexp.MustCompile(`^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])$`)

// ParseAddress reads "0000:65:00.0" or "65:00.0".
func ParseAddress(s string) (Address, error) {
	m := addressPattern.FindStringSubmatch(s)
	if m == nil {
		return Address{}, fmt.Errorf("%q is not a PCI address such as 0000:65:00.0 (domain:bus:slot.function, as lspci -D prints it)", s)
	}
	hex := func(s string) uint64 {
		if s == "" {
			return 0
		}
		v, _ := strconv.ParseUint(s, 16, 16) // the pattern admits hex digits only
		return v
	}
	return Address{Domain: uint16(hex(m[1])), Bus: uint8(hex(m[2])), Slot: uint8(hex(m[3])), Function: uint8(hex(m[4]))}, nil
}

// String is the address as lspci -D prints it.
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Slot, a.Function)
}

// NodeDeviceName is the name libvirt's node-device API gives the device
// (virsh nodedev-dumpxml pci_0000_65_00_0).
func (a Address) NodeDeviceName() string {
	return fmt.Sprintf("pci_%04x_%02x_%02x_%x", a.Domain, a.Bus, a.Slot, a.Function)
}
