package netalloc

import (
	"crypto/sha256"
	"fmt"
	"net"
	"strings"
)

// MAC is a 48-bit hardware address in libvirt's canonical form:
// lower-case hex pairs separated by colons (52:54:00:ab:cd:ef). libvirt,
// dnsmasq's lease files and users write MACs in other cases and styles;
// converting at the edge once lets everything else compare and index them
// as plain strings.
type MAC string

// ParseMAC parses a 48-bit hardware address in any form net.ParseMAC
// accepts (52-54-00-AB-CD-EF, 5254.00ab.cdef, ...).
func ParseMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("invalid MAC address %q", s)
	}
	return MAC(hw.String()), nil
}

// CanonicalMAC is s in canonical form when it parses, else s lower-cased:
// a key for indexes and maps, which must not fail on a malformed value
// read from the outside (it then matches nothing well-formed).
func CanonicalMAC(s string) MAC {
	if m, err := ParseMAC(s); err == nil {
		return m
	}
	return MAC(strings.ToLower(s))
}

// String is the canonical form.
func (m MAC) String() string { return string(m) }

// Canonical is m in canonical form (CanonicalMAC of its text): for a MAC
// a caller may have built from text it did not parse, at an exported
// call's edge.
func (m MAC) Canonical() MAC { return CanonicalMAC(string(m)) }

// qemuMAC returns a MAC in 52:54:00, the prefix QEMU and libvirt give guest
// NICs: locally administered and unicast, so it cannot clash with a vendor's.
func qemuMAC(nic [3]byte) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x00, nic[0], nic[1], nic[2]}
}

// MACFromSeed derives a 52:54:00:xx:xx:xx MAC from seed, such as the UID of
// the object that owns the NIC, so that a controller that crashes between
// choosing a MAC and persisting it chooses the same one again. Each NIC needs
// its own seed. Only 24 bits vary, so two seeds collide with probability
// about n²/2²⁵ among n NICs: check the network's existing DHCP hosts before
// reserving.
func MACFromSeed(seed string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(seed))
	return qemuMAC([3]byte(sum[:3]))
}

// SameMAC reports whether a and b are the same hardware address, ignoring
// case and separator style (52:54:00:AB:CD:EF, 52-54-00-ab-cd-ef,
// 5254.00ab.cdef). Unparseable input is never the same as anything.
func SameMAC(a, b string) bool {
	macA, errA := ParseMAC(a)
	macB, errB := ParseMAC(b)
	return errA == nil && errB == nil && macA == macB
}
