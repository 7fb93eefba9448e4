package virt

import (
	"net/netip"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

func TestNetworkAddresses(t *testing.T) {
	now := time.Now()
	mac := netalloc.MAC("52:54:00:00:00:0a")
	leases := []dhcpLease{
		{MAC: netalloc.CanonicalMAC("52:54:00:00:00:0A"), IP: netip.MustParseAddr("10.0.0.5"), Hostname: "debian", Expiry: now.Add(time.Hour)},
		{MAC: mac, IP: netip.MustParseAddr("fe80::5054:ff:fe00:a")},
		{MAC: mac, IP: netip.MustParseAddr("10.0.0.4"), Expiry: now.Add(-time.Hour)},
		{MAC: "52:54:00:00:00:0b", IP: netip.MustParseAddr("10.0.0.6")},
	}
	tests := []struct {
		name  string
		hosts []Reservation
		want  []Address
	}{
		{"lease confirms the reservation", []Reservation{{MAC: mac, IP: netip.MustParseAddr("10.0.0.5"), Hostname: "cp-0"}},
			[]Address{{IP: netip.MustParseAddr("10.0.0.5"), Source: AddressSourceLease, Hostname: "debian"}}},
		{"reservation not leased yet", []Reservation{{MAC: mac, IP: netip.MustParseAddr("10.0.0.9"), Hostname: "cp-0"}},
			[]Address{{IP: netip.MustParseAddr("10.0.0.5"), Source: AddressSourceLease, Hostname: "debian"},
				{IP: netip.MustParseAddr("10.0.0.9"), Source: AddressSourceReservation, Hostname: "cp-0"}}},
		{"no reservation", nil, []Address{{IP: netip.MustParseAddr("10.0.0.5"), Source: AddressSourceLease, Hostname: "debian"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := networkAddresses(leases, tt.hosts, mac, now)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestAgentAddresses(t *testing.T) {
	ifaces := []GuestInterface{
		{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128")}},
		{Name: "ens3", MAC: netalloc.CanonicalMAC("52:54:00:AA:00:01"), Addresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.20/24"), netip.MustParsePrefix("fe80::1/64"), netip.MustParsePrefix("2001:db8::20/64")}},
		{Name: "cni0", MAC: "52:54:00:aa:00:02", Addresses: []netip.Prefix{netip.MustParsePrefix("10.244.0.1/24")}},
	}
	got := agentAddresses(ifaces, "52:54:00:aa:00:01")
	want := []Address{{IP: netip.MustParseAddr("192.168.1.20"), Source: AddressSourceAgent}, {IP: netip.MustParseAddr("2001:db8::20"), Source: AddressSourceAgent}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %v, want %v", got, want)
	}
	if all := agentAddresses(ifaces, ""); len(all) != 3 {
		t.Errorf("without MAC got %v, want every non-loopback global address", all)
	}
}
