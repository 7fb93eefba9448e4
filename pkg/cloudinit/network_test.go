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
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v; want one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case !strings.Contains(string(got), tc.want):
				t.Fatalf("got\n%s\nwant it to contain\n%s", got, tc.want)
			}
		})
	}
}
