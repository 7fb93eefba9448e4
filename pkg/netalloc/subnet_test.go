package netalloc

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestValidatePrefix(t *testing.T) {
	tests := []struct {
		cidr    string
		wantErr string // substring; empty means valid
	}{
		{cidr: "192.168.150.0/24"},
		{cidr: "10.200.0.0/16"},
		{cidr: "172.16.5.16/28"},
		{cidr: "10.0.0.0/15", wantErr: "between /16 and /28"},
		{cidr: "10.0.0.0/29", wantErr: "between /16 and /28"},
		{cidr: "10.0.0.0/8", wantErr: "between /16 and /28"},
		{cidr: "10.0.0.1/24", wantErr: "network address is 10.0.0.0/24"},
		{cidr: "fd00::/64", wantErr: "only IPv4"},
		{cidr: "::ffff:10.0.0.0/120", wantErr: "only IPv4"},
		{cidr: "127.1.0.0/24", wantErr: "loopback"},
		{cidr: "169.254.10.0/24", wantErr: "link-local"},
		{cidr: "239.1.1.0/24", wantErr: "multicast"},
		{cidr: "250.0.0.0/24", wantErr: "reserved"},
		{cidr: "0.1.0.0/24", wantErr: "this network"},
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			assertError(t, ValidatePrefix(netip.MustParsePrefix(tt.cidr)), tt.wantErr)
		})
	}
	t.Run("zero prefix", func(t *testing.T) {
		assertError(t, ValidatePrefix(netip.Prefix{}), "not a valid prefix")
	})
}

func TestChooseSubnet(t *testing.T) {
	ethRoute := InUse{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Owner: "route via eth0"}
	inactiveNetwork := InUse{Prefix: netip.MustParsePrefix("192.168.150.0/24"), Owner: "libvirt network old-cluster (inactive)"}
	homeLAN := InUse{Prefix: netip.MustParsePrefix("192.168.1.0/24"), Owner: "address on wlan0"}
	podCIDR := InUse{Prefix: netip.MustParsePrefix("192.168.0.0/16"), Owner: "cluster pod CIDR"}
	ipv6 := InUse{Prefix: netip.MustParsePrefix("fd00::/8"), Owner: "address on eth0"}
	candidates := []netip.Prefix{
		netip.MustParsePrefix("192.168.150.0/24"),
		netip.MustParsePrefix("192.168.151.0/24"),
		netip.MustParsePrefix("10.200.0.0/24"),
	}

	tests := []struct {
		name         string
		requested    string // empty: none requested
		inUse        []InUse
		candidates   []netip.Prefix
		want         string
		wantConflict *InUse
		wantErr      error  // matched with errors.Is
		wantErrText  string // substring, for errors without a sentinel
	}{
		{name: "requested and free", requested: "172.30.5.0/24", inUse: []InUse{ethRoute, homeLAN}, want: "172.30.5.0/24"},
		{name: "requested inside a host route", requested: "10.0.0.0/24", inUse: []InUse{homeLAN, ethRoute}, wantConflict: &ethRoute},
		{name: "requested equals an inactive libvirt network", requested: "192.168.150.0/24", inUse: []InUse{inactiveNetwork}, wantConflict: &inactiveNetwork},
		{name: "requested /16 containing a used /24", requested: "192.168.0.0/16", inUse: []InUse{homeLAN}, wantConflict: &homeLAN},
		{name: "requested /24 inside a used /16", requested: "192.168.7.0/24", inUse: []InUse{podCIDR}, wantConflict: &podCIDR},
		{name: "requested adjacent to a used /24", requested: "192.168.2.0/24", inUse: []InUse{homeLAN}, want: "192.168.2.0/24"},
		{name: "requested ignores IPv6 in use", requested: "172.30.0.0/16", inUse: []InUse{ipv6}, want: "172.30.0.0/16"},
		{name: "requested wins over free candidates", requested: "172.30.5.0/24", candidates: candidates, want: "172.30.5.0/24"},
		{name: "requested too large", requested: "10.0.0.0/12", wantErrText: "between /16 and /28"},
		{name: "requested with host bits", requested: "172.30.5.1/24", wantErrText: "host bits"},
		{name: "requested IPv6", requested: "fd00:1::/64", wantErrText: "only IPv4"},
		{name: "first candidate free", candidates: candidates, inUse: []InUse{ethRoute}, want: "192.168.150.0/24"},
		{name: "skips an inactive libvirt network", candidates: candidates, inUse: []InUse{inactiveNetwork}, want: "192.168.151.0/24"},
		{name: "skips candidates inside the pod CIDR", candidates: candidates, inUse: []InUse{podCIDR}, want: "10.200.0.0/24"},
		{name: "exhausted", candidates: candidates, inUse: []InUse{podCIDR, ethRoute}, wantErr: ErrNoFreeSubnet},
		{name: "no candidates", wantErr: ErrNoFreeSubnet},
		{name: "invalid candidate", candidates: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, wantErrText: "invalid candidate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var requested netip.Prefix
			if tt.requested != "" {
				requested = netip.MustParsePrefix(tt.requested)
			}
			got, err := ChooseSubnet(requested, tt.inUse, tt.candidates)

			var conflict *ConflictError
			switch {
			case tt.wantConflict != nil:
				if !errors.As(err, &conflict) {
					t.Fatalf("ChooseSubnet() = %v, %v; want a *ConflictError", got, err)
				}
				if conflict.Requested != requested || conflict.With != *tt.wantConflict {
					t.Errorf("conflict = %+v, want requested %s with %+v", *conflict, requested, *tt.wantConflict)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ChooseSubnet() = %v, %v; want %v", got, err, tt.wantErr)
				}
			case tt.wantErrText != "":
				assertError(t, err, tt.wantErrText)
				if errors.As(err, &conflict) {
					t.Errorf("an invalid CIDR is reported as a conflict: %v", err)
				}
			default:
				if err != nil || got != netip.MustParsePrefix(tt.want) {
					t.Fatalf("ChooseSubnet() = %v, %v; want %s", got, err, tt.want)
				}
			}
			if err != nil && got != (netip.Prefix{}) {
				t.Errorf("ChooseSubnet() returned %v along with error %v", got, err)
			}
		})
	}
}

func TestConflictErrorMessage(t *testing.T) {
	err := &ConflictError{
		Requested: netip.MustParsePrefix("10.0.0.0/24"),
		With:      InUse{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Owner: "route via eth0"},
	}
	const want = "CIDR 10.0.0.0/24 conflicts with route via eth0 (10.0.0.0/8)"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}

func TestDefaultCandidates(t *testing.T) {
	avoid := []string{
		"192.168.122.0/24", // libvirt's default network
		"192.168.0.0/24",   // home routers
		"192.168.1.0/24",
		"172.16.0.0/12",   // Docker's default pools
		"10.96.0.0/12",    // kubeadm services
		"10.244.0.0/16",   // flannel pods
		"10.42.0.0/15",    // k3s pods and services
		"10.128.0.0/12",   // CAPD services
		"10.0.0.0/16",     // home routers and cloud VPCs
		"10.88.0.0/16",    // podman
		"100.64.0.0/10",   // carrier-grade NAT, Tailscale
		"192.168.49.0/24", // minikube
	}
	candidates := DefaultCandidates()
	if len(candidates) == 0 || candidates[0] != netip.MustParsePrefix("192.168.150.0/24") {
		t.Fatalf("DefaultCandidates() starts %v, want 192.168.150.0/24 first", candidates[:min(1, len(candidates))])
	}
	seen := make(map[netip.Prefix]bool)
	for _, c := range candidates {
		if err := ValidatePrefix(c); err != nil {
			t.Errorf("candidate %s: %v", c, err)
		}
		if c.Bits() != 24 {
			t.Errorf("candidate %s is not a /24", c)
		}
		if seen[c] {
			t.Errorf("candidate %s repeats", c)
		}
		seen[c] = true
		for _, a := range avoid {
			if c.Overlaps(netip.MustParsePrefix(a)) {
				t.Errorf("candidate %s overlaps %s", c, a)
			}
		}
	}

	candidates[0] = netip.Prefix{}
	if DefaultCandidates()[0] == (netip.Prefix{}) {
		t.Error("changing a returned slice changes the next call's result")
	}
}

// assertError checks err against wantErr, a substring of the expected
// message, or no error when wantErr is empty.
func assertError(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("error = %v, want nil", err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("error = %v, want one containing %q", err, wantErr)
	}
}

func TestCandidatesWithin(t *testing.T) {
	pfx := netip.MustParsePrefix
	rfc1918 := []netip.Prefix{pfx("10.0.0.0/8"), pfx("172.16.0.0/12"), pfx("192.168.0.0/16")}
	for _, tc := range []struct {
		name        string
		ranges      []netip.Prefix
		count       int
		first, last string
	}{
		{"nil: the defaults", nil, len(DefaultCandidates()), "192.168.150.0/24", "10.239.0.0/24"},
		{"RFC 1918 keeps the defaults", rfc1918, len(DefaultCandidates()), "192.168.150.0/24", "10.239.0.0/24"},
		{"some defaults", []netip.Prefix{pfx("10.0.0.0/8")}, 40, "10.200.0.0/24", "10.239.0.0/24"},
		{"far from the defaults", []netip.Prefix{pfx("100.64.0.0/10")}, maxCandidatesPerRange, "100.64.0.0/24", "100.64.255.0/24"},
		{"a small range is its own", []netip.Prefix{pfx("100.64.7.0/26")}, 1, "100.64.7.0/26", "100.64.7.0/26"},
		{"a /22 has four", []netip.Prefix{pfx("100.64.8.0/22")}, 4, "100.64.8.0/24", "100.64.11.0/24"},
		{"too small for a network", []netip.Prefix{pfx("100.64.7.0/30")}, 0, "", ""},
		{"none", []netip.Prefix{}, 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CandidatesWithin(tc.ranges)
			if len(got) != tc.count {
				t.Fatalf("CandidatesWithin(%v) has %d candidates; want %d", tc.ranges, len(got), tc.count)
			}
			if tc.count > 0 && (got[0].String() != tc.first || got[len(got)-1].String() != tc.last) {
				t.Errorf("CandidatesWithin(%v) = %v … %v; want %s … %s", tc.ranges, got[0], got[len(got)-1], tc.first, tc.last)
			}
			for _, c := range got {
				if err := ValidatePrefix(c); err != nil {
					t.Errorf("candidate %v: %v", c, err)
				}
			}
		})
	}
}
