package tenancy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

func TestCheckClusterNetworkCIDR(t *testing.T) {
	rfc1918, err := ParseNetworkCIDRs(DefaultNetworkCIDRs)
	if err != nil {
		t.Fatal(err)
	}
	def := Policy{NetworkCIDRs: rfc1918}
	none := Policy{NetworkCIDRs: []netip.Prefix{}}
	for _, tc := range []struct {
		name   string
		policy Policy
		net    infrav1.ClusterNetwork
		want   string // "" allows; else a part of the error
	}{
		{"private /24", def, infrav1.ClusterNetwork{CIDR: "192.168.150.0/24"}, ""},
		{"private 172.16/12", def, infrav1.ClusterNetwork{CIDR: "172.31.0.0/16"}, ""},
		{"a public range", def, infrav1.ClusterNetwork{CIDR: "8.8.8.0/24"}, "is not within 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 (the manager's --network-cidrs)"},
		{"straddles a private range", def, infrav1.ClusterNetwork{CIDR: "172.0.0.0/8"}, "--network-cidrs"},
		{"just past 172.16/12", def, infrav1.ClusterNetwork{CIDR: "172.32.0.0/24"}, "--network-cidrs"},
		{"CGNAT is not RFC 1918", def, infrav1.ClusterNetwork{CIDR: "100.64.0.0/24"}, "--network-cidrs"},
		{"chosen by the provider", def, infrav1.ClusterNetwork{}, ""},
		{"a named network has no range of ours", def, infrav1.ClusterNetwork{Name: "default", CIDR: "8.8.8.0/24"}, ""},
		{"a bridge has no range of ours", def, infrav1.ClusterNetwork{Bridge: "br0"}, ""},
		{"unparsable is another check's", def, infrav1.ClusterNetwork{CIDR: "x"}, ""},
		{"nil allows any", Policy{}, infrav1.ClusterNetwork{CIDR: "8.8.8.0/24"}, ""},
		{"none refuses a range", none, infrav1.ClusterNetwork{CIDR: "10.0.0.0/24"}, "allows no range"},
		{"none refuses a chosen range", none, infrav1.ClusterNetwork{}, "allows no range"},
		{"none allows a bridge", none, infrav1.ClusterNetwork{Bridge: "br0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "CheckClusterNetworkCIDR("+tc.net.CIDR+")", tc.policy.CheckClusterNetworkCIDR(tc.net), tc.want)
		})
	}
}

func TestParseNetworkCIDRs(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want []netip.Prefix // nil: any
		err  string
	}{
		{"default", DefaultNetworkCIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16")}, ""},
		{"any", []string{Any}, nil, ""},
		{"none", []string{None}, []netip.Prefix{}, ""},
		{"host bits masked", []string{" 10.1.2.3/16"}, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, ""},
		{"empty", nil, nil, "no network range"},
		{"malformed", []string{"10.0.0.0"}, nil, `"10.0.0.0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNetworkCIDRs(tc.in)
			check(t, "ParseNetworkCIDRs", err, tc.err)
			if err == nil && (!slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil)) {
				t.Errorf("ParseNetworkCIDRs(%q) = %v; want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestCheckPoolAddress(t *testing.T) {
	lan := []netip.Prefix{netip.MustParsePrefix("10.231.0.0/24")}
	for _, tc := range []struct {
		name    string
		cidrs   []netip.Prefix
		addr    string
		wantErr string
	}{
		{name: "any", cidrs: nil, addr: "203.0.113.5"},
		{name: "within", cidrs: lan, addr: "10.231.0.210"},
		{name: "outside", cidrs: lan, addr: "10.231.1.5", wantErr: "10.231.1.5 is not within 10.231.0.0/24"},
		{name: "none", cidrs: []netip.Prefix{}, addr: "10.231.0.210", wantErr: "allows no address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Policy{PoolAddressCIDRs: tc.cidrs}.CheckPoolAddress(netip.MustParseAddr(tc.addr))
			if (err != nil) != (tc.wantErr != "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v; want %q", err, tc.wantErr)
			}
		})
	}
}
