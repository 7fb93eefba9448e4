package netalloc

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestHostPrefixes reads this host's real addresses and routes, which any
// Linux host or container has at least a loopback address for.
func TestHostPrefixes(t *testing.T) {
	inUse, err := HostPrefixes()
	if err != nil {
		t.Fatalf("HostPrefixes() error = %v", err)
	}
	var addresses int
	for _, u := range inUse {
		t.Logf("%s: %s", u.Prefix, u.Owner)
		switch {
		case !u.Prefix.Addr().Is4():
			t.Errorf("%s (%s) is not IPv4", u.Prefix, u.Owner)
		case u.Prefix.Bits() == 0:
			t.Errorf("the default route (%s) is included", u.Owner)
		case u.Prefix != u.Prefix.Masked():
			t.Errorf("%s (%s) is not a network prefix", u.Prefix, u.Owner)
		case u.Owner == "" || strings.Contains(u.Owner, "interface #0"):
			t.Errorf("%s has owner %q, want one naming an interface", u.Prefix, u.Owner)
		}
		if strings.HasPrefix(u.Owner, "address on ") {
			addresses++
		}
	}
	if addresses == 0 {
		t.Errorf("HostPrefixes() found no address, not even loopback: %v", inUse)
	}
}

func TestHostPrefixesFromNetlink(t *testing.T) {
	ipNet := func(cidr string) *net.IPNet {
		ip, n, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip // keep host bits, as the kernel reports an address
		return n
	}
	names := interfaceNameByIndex{1: "lo", 2: "eth0", 5: "wg0"}
	addrs := []netlink.Addr{
		{IPNet: ipNet("127.0.0.1/8"), LinkIndex: 1},
		{IPNet: ipNet("192.168.1.23/24"), LinkIndex: 2},
		{IPNet: ipNet("10.9.0.2/32"), LinkIndex: 9}, // interface appeared after the names were listed
		{IPNet: ipNet("fd00::2/64"), LinkIndex: 2},
	}
	routes := []netlink.Route{
		{Dst: nil, Gw: net.ParseIP("192.168.1.1"), LinkIndex: 2, Table: unix.RT_TABLE_MAIN},
		{Dst: ipNet("0.0.0.0/0"), Gw: net.ParseIP("192.168.1.1"), LinkIndex: 2, Table: unix.RT_TABLE_MAIN},
		{Dst: ipNet("192.168.1.0/24"), LinkIndex: 2, Table: unix.RT_TABLE_MAIN},
		{Dst: ipNet("100.64.0.0/10"), LinkIndex: 5, Table: 52},
		{Dst: ipNet("10.0.0.0/8"), MultiPath: []*netlink.NexthopInfo{{LinkIndex: 5}, {LinkIndex: 2}}, Table: unix.RT_TABLE_MAIN},
		{Dst: ipNet("172.20.0.0/16"), Type: unix.RTN_BLACKHOLE, Table: unix.RT_TABLE_MAIN},
		{Dst: ipNet("192.168.1.23/32"), LinkIndex: 2, Table: unix.RT_TABLE_LOCAL},
	}
	want := []InUse{
		{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Owner: "address on lo"},
		{Prefix: netip.MustParsePrefix("192.168.1.0/24"), Owner: "address on eth0"},
		{Prefix: netip.MustParsePrefix("10.9.0.2/32"), Owner: "address on interface #9"},
		{Prefix: netip.MustParsePrefix("192.168.1.0/24"), Owner: "route via eth0"},
		{Prefix: netip.MustParsePrefix("100.64.0.0/10"), Owner: "route via wg0 in table 52"},
		{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Owner: "route via wg0"},
		{Prefix: netip.MustParsePrefix("172.20.0.0/16"), Owner: "blackhole route"},
	}
	if got := hostPrefixes(addrs, routes, names); !slices.Equal(got, want) {
		t.Errorf("hostPrefixes() =\n%v\nwant\n%v", got, want)
	}
}
