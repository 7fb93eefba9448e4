package ipaddress

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
)

func TestStaticAddress(t *testing.T) {
	pool := ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}
	claim := &ipamv1.IPAddressClaim{Spec: ipamv1.IPAddressClaimSpec{PoolRef: pool}}
	claim.Name = "m-ip-0"
	valid := ipamv1.IPAddressSpec{ClaimRef: ipamv1.IPAddressClaimReference{Name: "m-ip-0"}, PoolRef: pool,
		Address: "10.231.0.210", Prefix: ptr.To[int32](24), Gateway: "10.231.0.1"}
	for _, tc := range []struct {
		name    string
		change  func(s *ipamv1.IPAddressSpec)
		want    string
		wantErr string
	}{
		{name: "address, prefix and gateway", change: func(*ipamv1.IPAddressSpec) {}, want: "10.231.0.210/24 via 10.231.0.1"},
		{name: "no gateway", change: func(s *ipamv1.IPAddressSpec) { s.Gateway = "" }, want: "10.231.0.210/24 via invalid IP"},
		{name: "IPv6", change: func(s *ipamv1.IPAddressSpec) {
			s.Address, s.Prefix, s.Gateway = "fd00::10", ptr.To[int32](64), "fd00::1"
		}, want: "fd00::10/64 via fd00::1"},
		{name: "another claim's address", change: func(s *ipamv1.IPAddressSpec) { s.ClaimRef.Name = "other-ip-0" }, wantErr: "made for claim other-ip-0"},
		{name: "another pool's address", change: func(s *ipamv1.IPAddressSpec) { s.PoolRef.Name = "other" }, wantErr: "not for this claim"},
		{name: "a name, not an address", change: func(s *ipamv1.IPAddressSpec) { s.Address = "node.example" }, wantErr: "is not an IP address"},
		{name: "an address with a zone", change: func(s *ipamv1.IPAddressSpec) { s.Address = "fe80::1%eth0" }, wantErr: "is not an IP address"},
		{name: "no prefix", change: func(s *ipamv1.IPAddressSpec) { s.Prefix = nil }, wantErr: "prefix -1"},
		{name: "IPv4 prefix of 33", change: func(s *ipamv1.IPAddressSpec) { s.Prefix = ptr.To[int32](33) }, wantErr: "prefix 33"},
		{name: "gateway that is no address", change: func(s *ipamv1.IPAddressSpec) { s.Gateway = "router" }, wantErr: "gateway \"router\""},
		{name: "gateway outside the prefix", change: func(s *ipamv1.IPAddressSpec) { s.Gateway = "10.0.0.1" }, wantErr: "gateway 10.0.0.1"},
		{name: "loopback", change: func(s *ipamv1.IPAddressSpec) { s.Address, s.Gateway = "127.0.0.2", "" }, wantErr: "not a unicast address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := &ipamv1.IPAddress{Spec: *valid.DeepCopy()}
			tc.change(&ip.Spec)
			a, err := staticAddress(ip, claim)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v; want one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case a.Prefix.String()+" via "+a.Gateway.String() != tc.want:
				t.Fatalf("got %s via %s, want %s", a.Prefix, a.Gateway, tc.want)
			}
		})
	}
}
