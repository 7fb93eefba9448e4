package netalloc

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dumpAttempts bounds how often a netlink dump is retried when the kernel
// reports it interrupted by a concurrent change, since such a result may be
// incomplete.
const dumpAttempts = 5

// HostPrefixes returns every IPv4 prefix the host uses: the network of each
// address ("address on eth0") and the destination of each route in any
// routing table ("route via eth0", "route via wg0 in table 52"), so that VPN
// and policy routes count too. The default route is skipped since it overlaps
// everything. The result may list a prefix twice, once per owner.
func HostPrefixes() ([]InUse, error) {
	names, err := interfaceNames()
	if err != nil {
		return nil, err
	}
	addrs, err := dumpConsistently(func() ([]netlink.Addr, error) {
		return netlink.AddrList(nil, netlink.FAMILY_V4)
	})
	if err != nil {
		return nil, fmt.Errorf("listing IPv4 addresses: %w", err)
	}
	routes, err := dumpConsistently(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("listing IPv4 routes: %w", err)
	}

	return hostPrefixes(addrs, routes, names), nil
}

// hostPrefixes is HostPrefixes without the netlink calls.
func hostPrefixes(addrs []netlink.Addr, routes []netlink.Route, names interfaceNameByIndex) []InUse {
	var inUse []InUse
	for _, a := range addrs {
		if p, ok := ipv4Prefix(a.IPNet); ok {
			inUse = append(inUse, InUse{Prefix: p, Owner: "address on " + names.of(a.LinkIndex)})
		}
	}
	for _, r := range routes {
		// The local table holds the local and broadcast routes the kernel
		// derives from the addresses listed above.
		if r.Table == unix.RT_TABLE_LOCAL {
			continue
		}
		if p, ok := ipv4Prefix(r.Dst); ok && p.Bits() > 0 {
			inUse = append(inUse, InUse{Prefix: p, Owner: routeOwner(r, names)})
		}
	}
	return inUse
}

func dumpConsistently[T any](dump func() ([]T, error)) ([]T, error) {
	var err error
	for range dumpAttempts {
		var items []T
		if items, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return items, err
		}
	}
	return nil, err
}

// ipv4Prefix converts an address or route destination to its network prefix;
// it reports false for nil, for IPv6 and for a mask that does not fit IPv4.
func ipv4Prefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	if addr = addr.Unmap(); !ok || !addr.Is4() {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	p, err := addr.Prefix(bits)
	return p, err == nil
}

type interfaceNameByIndex map[int]string

func interfaceNames() (interfaceNameByIndex, error) {
	interfaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	names := make(interfaceNameByIndex, len(interfaces))
	for _, i := range interfaces {
		names[i.Index] = i.Name
	}
	return names, nil
}

// of tolerates an interface that appeared after the names were listed.
func (names interfaceNameByIndex) of(index int) string {
	if name, ok := names[index]; ok {
		return name
	}
	return fmt.Sprintf("interface #%d", index)
}

// routeKinds names the route types that have no interface to name.
var routeKinds = map[int]string{
	unix.RTN_BLACKHOLE:   "blackhole route",
	unix.RTN_UNREACHABLE: "unreachable route",
	unix.RTN_PROHIBIT:    "prohibit route",
}

func routeOwner(r netlink.Route, names interfaceNameByIndex) string {
	link := r.LinkIndex
	if link == 0 && len(r.MultiPath) > 0 {
		link = r.MultiPath[0].LinkIndex
	}
	owner, special := routeKinds[r.Type]
	if !special {
		owner = "route"
	}
	if link > 0 {
		owner += " via " + names.of(link)
	}
	if r.Table != unix.RT_TABLE_MAIN {
		owner += fmt.Sprintf(" in table %d", r.Table)
	}
	return owner
}

// InterfaceAddresses are the addresses of the host's interface name (a
// bridge the guests share with the host); none when it has none or does
// not exist.
func InterfaceAddresses(name string) ([]netip.Addr, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("looking up interface %s: %w", name, err)
	}
	addrs, err := dumpConsistently(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("listing the addresses of %s: %w", name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
