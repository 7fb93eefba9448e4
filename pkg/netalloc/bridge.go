package netalloc

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
)

// bridgePrefix marks the bridges this provider creates.
const bridgePrefix = "capl"

// maxInterfaceName is the longest Linux interface name: IFNAMSIZ less its NUL.
const maxInterfaceName = 15

// BridgeName returns the Linux bridge name for the libvirt network called
// networkName: "capl" and 11 hex digits of the name's SHA-256, 15 characters,
// the kernel's limit. A hash rather than the name itself keeps any network
// name valid and distinct names apart (44 bits), and it is deterministic so
// a re-created network gets its old bridge back.
func BridgeName(networkName string) string {
	sum := sha256.Sum256([]byte(networkName))
	return bridgePrefix + hex.EncodeToString(sum[:])[:maxInterfaceName-len(bridgePrefix)]
}

// IsBridgeName tells whether name has the form BridgeName gives: the
// bridge of a network the provider created.
func IsBridgeName(name string) bool {
	sum, ok := strings.CutPrefix(name, bridgePrefix)
	if !ok || len(sum) != maxInterfaceName-len(bridgePrefix) {
		return false
	}
	_, err := hex.DecodeString(sum + "0") // an odd number of digits
	return err == nil && strings.ToLower(sum) == sum
}

// InterfaceHolding names the host interface that holds ip. For a server
// bound to every address, ip is a connection's local address, and the
// interface tells which network the client came from: the plane's servers
// answer guests only on the bridges IsBridgeName recognises.
func InterfaceHolding(ip net.IP) (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifaces {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return i.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface holds %s", ip)
}

// OnProviderBridge returns nil when local, the local address of a
// connection to a server bound to every address, is on the bridge of a
// network the provider made, as holding (InterfaceHolding, or a test's
// stand-in) names its interface; otherwise an error saying where it is.
func OnProviderBridge(local net.IP, holding func(net.IP) (string, error)) error {
	if local == nil {
		return errors.New("no local address")
	}
	iface, err := holding(local)
	if err != nil {
		return err
	}
	if !IsBridgeName(iface) {
		return fmt.Errorf("%s is on %s, not on the bridge of a network of the provider", local, iface)
	}
	return nil
}
