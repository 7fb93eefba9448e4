package netalloc

import (
	"errors"
	"net/netip"
	"testing"
)

func TestAddressing(t *testing.T) {
	tests := []struct {
		cidr                                   string
		gateway, dhcpStart, dhcpEnd, broadcast string
	}{
		{cidr: "192.168.150.0/24", gateway: "192.168.150.1", dhcpStart: "192.168.150.2", dhcpEnd: "192.168.150.254", broadcast: "192.168.150.255"},
		{cidr: "10.200.0.0/16", gateway: "10.200.0.1", dhcpStart: "10.200.0.2", dhcpEnd: "10.200.255.254", broadcast: "10.200.255.255"},
		{cidr: "172.16.5.16/28", gateway: "172.16.5.17", dhcpStart: "172.16.5.18", dhcpEnd: "172.16.5.30", broadcast: "172.16.5.31"},
		// Host bits are ignored rather than shifting every address.
		{cidr: "192.168.150.77/24", gateway: "192.168.150.1", dhcpStart: "192.168.150.2", dhcpEnd: "192.168.150.254", broadcast: "192.168.150.255"},
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			p := netip.MustParsePrefix(tt.cidr)
			start, end := DHCPRange(p)
			got := []netip.Addr{Gateway(p), start, end, Broadcast(p)}
			want := []string{tt.gateway, tt.dhcpStart, tt.dhcpEnd, tt.broadcast}
			for i, name := range []string{"Gateway", "DHCP start", "DHCP end", "Broadcast"} {
				if got[i] != netip.MustParseAddr(want[i]) {
					t.Errorf("%s = %s, want %s", name, got[i], want[i])
				}
			}
		})
	}
	t.Run("Broadcast of IPv6", func(t *testing.T) {
		if got := Broadcast(netip.MustParsePrefix("fd00::/64")); got.IsValid() {
			t.Errorf("Broadcast = %s, want the zero Addr", got)
		}
	})
}

func TestNextFreeAddress(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	tests := []struct {
		name    string
		cidr    string
		used    []netip.Addr
		want    string
		wantErr error
	}{
		{name: "nothing used", cidr: "192.168.150.0/24", want: "192.168.150.2"},
		{name: "gateway is never handed out", cidr: "192.168.150.0/24", used: addrs("192.168.150.1"), want: "192.168.150.2"},
		{name: "skips used", cidr: "192.168.150.0/24", used: addrs("192.168.150.2", "192.168.150.3"), want: "192.168.150.4"},
		{name: "lowest gap, used unordered", cidr: "192.168.150.0/24", used: addrs("192.168.150.5", "192.168.150.2", "192.168.150.4"), want: "192.168.150.3"},
		{name: "used outside the range is ignored", cidr: "192.168.150.0/24", used: addrs("10.0.0.2", "192.168.151.2"), want: "192.168.150.2"},
		{name: "IPv4-mapped used", cidr: "192.168.150.0/24", used: addrs("::ffff:192.168.150.2"), want: "192.168.150.3"},
		{name: "crosses an octet in a /16", cidr: "10.200.0.0/16", used: rangeOf("10.200.0.2", "10.200.0.255"), want: "10.200.1.0"},
		{name: "last address of a /28", cidr: "172.16.5.16/28", used: rangeOf("172.16.5.18", "172.16.5.29"), want: "172.16.5.30"},
		{name: "full /28", cidr: "172.16.5.16/28", used: rangeOf("172.16.5.18", "172.16.5.30"), wantErr: ErrNoFreeAddress},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NextFreeAddress(netip.MustParsePrefix(tt.cidr), tt.used)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("NextFreeAddress() = %v, %v; want %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != netip.MustParseAddr(tt.want) {
				t.Fatalf("NextFreeAddress() = %v, %v; want %s", got, err, tt.want)
			}
		})
	}
	t.Run("invalid prefix", func(t *testing.T) {
		if got, err := NextFreeAddress(netip.MustParsePrefix("10.0.0.0/8"), nil); err == nil {
			t.Fatalf("NextFreeAddress() = %v, want an error", got)
		}
	})
}

// rangeOf lists the addresses from first to last inclusive.
func rangeOf(first, last string) []netip.Addr {
	var out []netip.Addr
	for a := netip.MustParseAddr(first); a.Compare(netip.MustParseAddr(last)) <= 0; a = a.Next() {
		out = append(out, a)
	}
	return out
}
