package cloudinit

import (
	"net/netip"
	"strings"
	"testing"
)

func TestDHCPWithStaticAddress(t *testing.T) {
	valid := DHCPWithStaticAddress{MAC: "52:54:00:12:34:56", InterfaceName: "enp1s0", Static: netip.MustParseAddr("10.231.0.240")}
	for _, tc := range []struct {
		name    string
		nic     func(n *DHCPWithStaticAddress)
		want    string
		wantErr string
	}{
		{name: "IPv4 endpoint as a host route next to DHCP", nic: func(*DHCPWithStaticAddress) {}, want: `config:
- mac_address: "52:54:00:12:34:56"
  name: enp1s0
  subnets:
  - type: dhcp
  - address: 10.231.0.240/32
    type: static
  type: physical
version: 1
`},
		{name: "IPv6 endpoint", nic: func(n *DHCPWithStaticAddress) { n.Static = netip.MustParseAddr("fd00::10") }, want: "address: fd00::10/128"},
		{name: "bad MAC", nic: func(n *DHCPWithStaticAddress) { n.MAC = "52:54:00" }, wantErr: "network-config"},
		{name: "no interface", nic: func(n *DHCPWithStaticAddress) { n.InterfaceName = "" }, wantErr: "no interface name"},
		{name: "no address", nic: func(n *DHCPWithStaticAddress) { n.Static = netip.Addr{} }, wantErr: "not a unicast address"},
		{name: "unspecified", nic: func(n *DHCPWithStaticAddress) { n.Static = netip.IPv4Unspecified() }, wantErr: "not a unicast address"},
		{name: "multicast", nic: func(n *DHCPWithStaticAddress) { n.Static = netip.MustParseAddr("224.0.0.1") }, wantErr: "not a unicast address"},
		{name: "loopback", nic: func(n *DHCPWithStaticAddress) { n.Static = netip.MustParseAddr("127.0.0.1") }, wantErr: "not a unicast address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := valid
			tc.nic(&n)
			got, err := n.NetworkConfig()
			checkNetworkConfig(t, got, err, tc.want, tc.wantErr)
		})
	}
}

func TestStaticNIC(t *testing.T) {
	v4 := StaticAddress{Prefix: netip.MustParsePrefix("10.231.0.210/24"), Gateway: netip.MustParseAddr("10.231.0.1")}
	valid := StaticNIC{MAC: "52:54:00:12:34:56", InterfaceName: "enp1s0", Addresses: []StaticAddress{v4},
		Nameservers: []netip.Addr{netip.MustParseAddr("10.231.0.2")}}
	for _, tc := range []struct {
		name    string
		nic     func(n *StaticNIC)
		want    string
		wantErr string
	}{
		{name: "IPv4 from a pool, no DHCP", nic: func(*StaticNIC) {}, want: `config:
- mac_address: "52:54:00:12:34:56"
  name: enp1s0
  subnets:
  - address: 10.231.0.210/24
    dns_nameservers:
    - 10.231.0.2
    gateway: 10.231.0.1
    type: static
  type: physical
version: 1
`},
		{name: "IPv4 and IPv6, the second without gateway", nic: func(n *StaticNIC) {
			n.Addresses = append(n.Addresses, StaticAddress{Prefix: netip.MustParsePrefix("fd00::10/64")})
		}, want: "  - address: fd00::10/64\n    type: static\n"},
		{name: "no nameserver", nic: func(n *StaticNIC) { n.Nameservers = nil }, want: "  - address: 10.231.0.210/24\n    gateway: 10.231.0.1\n"},
		{name: "bad MAC", nic: func(n *StaticNIC) { n.MAC = "x" }, wantErr: "network-config"},
		{name: "no interface", nic: func(n *StaticNIC) { n.InterfaceName = "" }, wantErr: "no interface name"},
		{name: "no address", nic: func(n *StaticNIC) { n.Addresses = nil }, wantErr: "no address"},
		{name: "loopback", nic: func(n *StaticNIC) { n.Addresses[0].Prefix = netip.MustParsePrefix("127.0.0.5/8") }, wantErr: "not a unicast address"},
		{name: "link-local", nic: func(n *StaticNIC) { n.Addresses[0].Prefix = netip.MustParsePrefix("169.254.0.5/16") }, wantErr: "not a unicast address"},
		{name: "gateway outside the network", nic: func(n *StaticNIC) { n.Addresses[0].Gateway = netip.MustParseAddr("10.231.1.1") }, wantErr: "gateway 10.231.1.1"},
		{name: "gateway is the address", nic: func(n *StaticNIC) { n.Addresses[0].Gateway = netip.MustParseAddr("10.231.0.210") }, wantErr: "gateway 10.231.0.210"},
		{name: "IPv6 gateway of an IPv4 address", nic: func(n *StaticNIC) { n.Addresses[0].Gateway = netip.MustParseAddr("fd00::1") }, wantErr: "gateway fd00::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := valid
			n.Addresses = append([]StaticAddress(nil), valid.Addresses...)
			tc.nic(&n)
			got, err := n.NetworkConfig()
			checkNetworkConfig(t, got, err, tc.want, tc.wantErr)
		})
	}
}

// checkNetworkConfig fails t unless err contains wantErr, or, when wantErr
// is empty, got contains want.
func checkNetworkConfig(t *testing.T, got []byte, err error, want, wantErr string) {
	t.Helper()
	switch {
	case wantErr != "":
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("err %v; want one containing %q", err, wantErr)
		}
	case err != nil:
		t.Fatal(err)
	case !strings.Contains(string(got), want):
		t.Fatalf("got\n%s\nwant it to contain\n%s", got, want)
	}
}
