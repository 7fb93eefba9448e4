package virt

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

func TestPlanReservation(t *testing.T) {
	subnet := netip.MustParsePrefix("10.0.0.0/24")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ip := netip.MustParseAddr
	macA, macB := netalloc.MAC("52:54:00:00:00:0a"), netalloc.MAC("52:54:00:00:00:0b")
	entries := func(rs ...Reservation) reservationState { return &rs }
	tests := []struct {
		name       string
		live       reservationState
		config     reservationState
		leases     []dhcpLease
		r          Reservation
		want       reservationPlan
		wantReason AddressConflictReason
	}{
		{
			name: "first free address, both definitions",
			live: entries(), config: entries(),
			r:    Reservation{MAC: macA},
			want: reservationPlan{ip: ip("10.0.0.2"), addLive: true, addConfig: true},
		},
		{
			name: "skips reserved and leased addresses",
			live: entries(Reservation{MAC: macB, IP: ip("10.0.0.2")}), config: entries(Reservation{MAC: macB, IP: ip("10.0.0.2")}),
			leases: []dhcpLease{{MAC: "52:54:00:00:00:0c", IP: ip("10.0.0.3"), Expiry: now.Add(time.Hour)}},
			r:      Reservation{MAC: macA},
			want:   reservationPlan{ip: ip("10.0.0.4"), addLive: true, addConfig: true},
		},
		{
			name: "expired lease does not block",
			live: entries(), config: entries(),
			leases: []dhcpLease{{MAC: macB, IP: ip("10.0.0.2"), Expiry: now.Add(-time.Second)}},
			r:      Reservation{MAC: macA},
			want:   reservationPlan{ip: ip("10.0.0.2"), addLive: true, addConfig: true},
		},
		{
			name: "keeps the address the MAC already leases",
			live: entries(), config: entries(),
			leases: []dhcpLease{{MAC: netalloc.CanonicalMAC("52:54:00:00:00:0A"), IP: ip("10.0.0.77")}},
			r:      Reservation{MAC: macA},
			want:   reservationPlan{ip: ip("10.0.0.77"), addLive: true, addConfig: true},
		},
		{
			name: "idempotent, the MAC read back in another case",
			live: entries(Reservation{MAC: netalloc.CanonicalMAC("52:54:00:00:00:0A"), IP: ip("10.0.0.9")}), config: entries(Reservation{MAC: macA, IP: ip("10.0.0.9")}),
			r:    Reservation{MAC: macA},
			want: reservationPlan{ip: ip("10.0.0.9")},
		},
		{
			name: "repairs the definition that lacks it",
			live: entries(), config: entries(Reservation{MAC: macA, IP: ip("10.0.0.9")}),
			r:    Reservation{MAC: macA, IP: ip("10.0.0.9")},
			want: reservationPlan{ip: ip("10.0.0.9"), addLive: true},
		},
		{
			name:   "inactive network: config only",
			config: entries(),
			r:      Reservation{MAC: macA, IP: ip("10.0.0.50")},
			want:   reservationPlan{ip: ip("10.0.0.50"), addConfig: true},
		},
		{
			name: "IP reserved for another MAC",
			live: entries(Reservation{MAC: macB, IP: ip("10.0.0.50")}), config: entries(Reservation{MAC: macB, IP: ip("10.0.0.50")}),
			r:          Reservation{MAC: macA, IP: ip("10.0.0.50")},
			wantReason: ConflictIPReserved,
		},
		{
			name: "IP leased to another MAC (stale lease of a deleted machine)",
			live: entries(), config: entries(),
			leases:     []dhcpLease{{MAC: macB, IP: ip("10.0.0.50"), Expiry: now.Add(time.Minute)}},
			r:          Reservation{MAC: macA, IP: ip("10.0.0.50")},
			wantReason: ConflictLeased,
		},
		{
			name: "MAC reserved with another IP",
			live: entries(Reservation{MAC: macA, IP: ip("10.0.0.9")}), config: entries(Reservation{MAC: macA, IP: ip("10.0.0.9")}),
			r:          Reservation{MAC: macA, IP: ip("10.0.0.10")},
			wantReason: ConflictMACReserved,
		},
		{
			name: "hostname taken by another MAC",
			live: entries(Reservation{MAC: macB, IP: ip("10.0.0.9"), Hostname: "cp-0"}), config: entries(),
			r:          Reservation{MAC: macA, Hostname: "cp-0"},
			wantReason: ConflictHostnameReserved,
		},
		{
			name: "gateway is not usable",
			live: entries(), config: entries(),
			r:          Reservation{MAC: macA, IP: ip("10.0.0.1")},
			wantReason: ConflictOutsideSubnet,
		},
		{
			name: "outside the subnet",
			live: entries(), config: entries(),
			r:          Reservation{MAC: macA, IP: ip("10.0.1.5")},
			wantReason: ConflictOutsideSubnet,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := planReservation("net", subnet, tt.live, tt.config, tt.leases, tt.r, now)
			if tt.wantReason != "" {
				var ae *AddressConflictError
				if !errors.As(err, &ae) || ae.Reason != tt.wantReason || !errors.Is(err, ErrAddressConflict) {
					t.Fatalf("err = %v, want reason %s", err, tt.wantReason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPlanReservationNoFreeAddress(t *testing.T) {
	subnet := netip.MustParsePrefix("10.0.0.0/30") // only 10.0.0.2 is usable
	hosts := []Reservation{{MAC: "52:54:00:00:00:0b", IP: netip.MustParseAddr("10.0.0.2")}}
	_, err := planReservation("net", subnet, &hosts, nil, nil, Reservation{MAC: "52:54:00:00:00:0a"}, time.Now())
	var ae *AddressConflictError
	if !errors.As(err, &ae) || ae.Reason != ConflictNoFreeAddress {
		t.Fatalf("err = %v", err)
	}
}

func TestLeaseCurrent(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name  string
		lease dhcpLease
		want  bool
	}{
		{"unexpired", dhcpLease{IP: netip.MustParseAddr("10.0.0.2"), Expiry: now.Add(time.Minute)}, true},
		{"infinite", dhcpLease{IP: netip.MustParseAddr("10.0.0.2")}, true},
		{"expired", dhcpLease{IP: netip.MustParseAddr("10.0.0.2"), Expiry: now.Add(-time.Minute)}, false},
		{"IPv6 link-local", dhcpLease{IP: netip.MustParseAddr("fe80::5054:ff:fe00:1")}, false},
		{"IPv6 global", dhcpLease{IP: netip.MustParseAddr("fd00::5")}, true},
		{"no address", dhcpLease{}, false},
	}
	for _, tt := range tests {
		if got := tt.lease.Current(now); got != tt.want {
			t.Errorf("%s: current = %v", tt.name, got)
		}
	}
}
