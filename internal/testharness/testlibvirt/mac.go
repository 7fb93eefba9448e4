package testlibvirt

import (
	"crypto/rand"
	"fmt"
	"net"
)

// NewMAC returns a random 52:54:00:xx:xx:xx MAC from crypto/rand, for a
// test's NIC that no object's UID derives a MAC for. The provider itself
// only uses MACs derived from UIDs (netalloc.MACFromSeed).
func NewMAC() (net.HardwareAddr, error) {
	var nic [3]byte
	if _, err := rand.Read(nic[:]); err != nil {
		return nil, fmt.Errorf("generating a MAC: %w", err)
	}
	return net.HardwareAddr{0x52, 0x54, 0x00, nic[0], nic[1], nic[2]}, nil
}
