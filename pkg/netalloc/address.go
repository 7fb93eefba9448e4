package netalloc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// ErrNoFreeAddress is returned (wrapped) by NextFreeAddress when every address
// of the DHCP range is taken.
var ErrNoFreeAddress = errors.New("no free address")

// Gateway returns the first host address of p (.1 of a /24), which the host's
// bridge takes.
func Gateway(p netip.Prefix) netip.Addr {
	return p.Masked().Addr().Next()
}

// Broadcast returns the last address of the IPv4 prefix p (.255 of a /24), or
// the zero Addr if p is not a valid IPv4 prefix.
func Broadcast(p netip.Prefix) netip.Addr {
	if !p.IsValid() || !p.Addr().Is4() {
		return netip.Addr{}
	}
	network := p.Masked().Addr().As4()
	hostBits := uint32(1)<<(32-p.Bits()) - 1
	var last [4]byte
	binary.BigEndian.PutUint32(last[:], binary.BigEndian.Uint32(network[:])|hostBits)
	return netip.AddrFrom4(last)
}

// DHCPRange returns the range dnsmasq hands out and from which guests are
// pinned: every host address after the gateway, .2 to .254 of a /24.
func DHCPRange(p netip.Prefix) (start, end netip.Addr) {
	return Gateway(p).Next(), Broadcast(p).Prev()
}

// NextFreeAddress returns the lowest address of p's DHCP range that is not in
// used, which should list the network's reservations and live leases.
// Choosing the lowest keeps the choice deterministic. Addresses in used may be
// IPv4-mapped IPv6, as net.IP conversions produce.
func NextFreeAddress(p netip.Prefix, used []netip.Addr) (netip.Addr, error) {
	if err := ValidatePrefix(p); err != nil {
		return netip.Addr{}, err
	}
	taken := make(map[netip.Addr]bool, len(used))
	for _, a := range used {
		taken[a.Unmap()] = true
	}
	start, end := DHCPRange(p)
	for a := start; a.Compare(end) <= 0; a = a.Next() {
		if !taken[a] {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w in %s: every address from %s to %s is reserved or leased", ErrNoFreeAddress, p, start, end)
}
