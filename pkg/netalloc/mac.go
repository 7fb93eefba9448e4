package netalloc

import (
	"bytes"
	"crypto/sha256"
	"net"
)

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
	macA, errA := net.ParseMAC(a)
	macB, errB := net.ParseMAC(b)
	return errA == nil && errB == nil && bytes.Equal(macA, macB)
}
