package segment_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestSegmentHolders: each holder of an address on the segment refuses it
// (the fake network 192.168.100.0/24: gateway .1, DHCP .2–.254, so the
// free addresses the table takes lie on a bridge or are given by the
// fake's own lists), another host's domains count, the VM's own domain
// and entry do not.
func TestSegmentHolders(t *testing.T) {
	self := virt.Owner{Kind: "LibvirtMachine", Namespace: "ns", Name: "m0"}
	other := virt.Owner{Kind: "LibvirtMachine", Namespace: "other", Name: "m1"}
	mac := netalloc.MAC("52:54:00:00:00:01")
	addr := netip.MustParseAddr("10.0.0.5")
	for _, tc := range []struct {
		name    string
		network scope.NetworkRef
		addr    netip.Addr
		setup   func(local, remote *fakehost.Host)
		want    string // "" for free
	}{
		{name: "gateway", network: scope.NetworkRef{Name: "net"}, addr: netip.MustParseAddr("192.168.100.1"), want: "own address"},
		{name: "DHCP range", network: scope.NetworkRef{Name: "net"}, addr: netip.MustParseAddr("192.168.100.77"), want: "DHCP range"},
		{name: "free on a bridge", network: scope.NetworkRef{Bridge: "br0"}, addr: addr},
		{name: "another's domain on a bridge", network: scope.NetworkRef{Bridge: "br0"}, addr: addr, want: "held by another VM",
			setup: func(local, _ *fakehost.Host) {
				local.Specs["d1"] = virt.DomainSpec{Name: "d1", Bridge: "br0", Owner: other, MAC: "52:54:00:00:00:02", StaticAddresses: []netip.Addr{addr}}
			}},
		{name: "another host's domain on the bridge", network: scope.NetworkRef{Bridge: "br0"}, addr: addr, want: "held by another VM",
			setup: func(_, remote *fakehost.Host) {
				remote.Specs["d1"] = virt.DomainSpec{Name: "d1", Bridge: "br0", Owner: other, MAC: "52:54:00:00:00:02", StaticAddresses: []netip.Addr{addr}}
			}},
		{name: "own domain", network: scope.NetworkRef{Bridge: "br0"}, addr: addr,
			setup: func(local, _ *fakehost.Host) {
				local.Specs["d0"] = virt.DomainSpec{Name: "d0", Bridge: "br0", Owner: self, MAC: mac, StaticAddresses: []netip.Addr{addr}}
			}},
		{name: "a domain on another bridge", network: scope.NetworkRef{Bridge: "br0"}, addr: addr,
			setup: func(local, _ *fakehost.Host) {
				local.Specs["d1"] = virt.DomainSpec{Name: "d1", Bridge: "br1", Owner: other, MAC: "52:54:00:00:00:02", StaticAddresses: []netip.Addr{addr}}
			}},
		{name: "reserved for another MAC", network: scope.NetworkRef{Name: "wide"}, addr: addr, want: "reserved",
			setup: func(local, _ *fakehost.Host) {
				local.Entries["wide"] = []virt.Reservation{{MAC: "52:54:00:00:00:02", IP: addr}}
			}},
		{name: "reserved for the VM's MAC", network: scope.NetworkRef{Name: "wide"}, addr: addr,
			setup: func(local, _ *fakehost.Host) { local.Entries["wide"] = []virt.Reservation{{MAC: mac, IP: addr}} }},
		{name: "leased to another MAC", network: scope.NetworkRef{Name: "wide"}, addr: addr, want: "leased",
			setup: func(local, _ *fakehost.Host) {
				local.Entries["wide"] = nil
				local.Leases["wide"] = map[string]netip.Addr{"52:54:00:00:00:02": addr}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local, remote := fakehost.New(), fakehost.New()
			if tc.setup != nil {
				tc.setup(local, remote)
			}
			vm := &scope.VM{Domain: "d0", Owner: self, MAC: mac, Network: tc.network}
			others := func() []virt.NetworkHost { return []virt.NetworkHost{local, remote} }
			err := segment.New(vm, local, others).CheckAddresses(context.Background(), []netip.Addr{tc.addr})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ce *services.ConditionError
			if !asCondition(err, &ce) || ce.Reason != infrav1.AddressInUseReason || !strings.Contains(ce.Message, tc.want) {
				t.Fatalf("err = %v, want AddressInUse saying %q", err, tc.want)
			}
		})
	}
}

func asCondition(err error, ce **services.ConditionError) bool {
	c, ok := err.(*services.ConditionError) //nolint:errorlint // the service returns it unwrapped
	*ce = c
	return ok
}
