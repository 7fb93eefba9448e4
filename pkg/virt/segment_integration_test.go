package virt_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestSegmentUse reads an operator's network as the segment checks do: its
// gateway, its narrowed DHCP range, a host entry, and a defined domain on
// it with the static address its metadata records (DomainInfo reports the
// same); a domain on a host bridge with the bridge's own address.
func TestSegmentUse(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	lan := testlibvirt.OperatorNetwork(t, e.uri, e.c, virt.Owner{Kind: "LibvirtCluster", Namespace: "test", Cluster: "segment"}, nil)
	bridgeAddr := netip.MustParsePrefix("198.51.100.1/24")
	bridge := testlibvirt.HostBridge(t, bridgeAddr)
	o := lan.CIDR.Addr().As4()
	o[3] = 150
	static := netip.AddrFrom4(o)
	entryMAC := netalloc.MAC("52:54:00:5e:9a:02")
	if _, err := e.c.ReserveAddress(ctx, lan.Name, virt.Reservation{MAC: entryMAC, IP: static.Prev()}); err != nil {
		t.Fatal(err)
	}
	spec := e.lifecycleSpec(t)
	spec.Network, spec.MAC, spec.StaticAddresses = lan.Name, "52:54:00:5e:9a:03", []netip.Addr{static}
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.DeleteDomain(context.Background(), spec.Name) })

	use, err := e.c.SegmentUse(ctx, lan.Name, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", use)
	if !slices.Contains(use.Own, lan.Gateway) {
		t.Errorf("own addresses %v, want the gateway %s", use.Own, lan.Gateway)
	}
	if len(use.DHCPRanges) != 1 || use.DHCPRanges[0].Contains(static) || !use.DHCPRanges[0].Contains(lan.Gateway.Next()) {
		t.Errorf("DHCP ranges %+v, want .2-.99", use.DHCPRanges)
	}
	if !slices.ContainsFunc(use.Reservations, func(r virt.Reservation) bool { return r.MAC == entryMAC && r.IP == static.Prev() }) {
		t.Errorf("reservations %+v, want %s for %s", use.Reservations, static.Prev(), entryMAC)
	}
	i := slices.IndexFunc(use.Domains, func(d virt.SegmentDomain) bool { return d.Name == spec.Name })
	if i < 0 {
		t.Fatalf("domains %+v, want %s", use.Domains, spec.Name)
	}
	if d := use.Domains[i]; !d.Owner.IsObject(spec.Owner) || !slices.Equal(d.MACs, []netalloc.MAC{spec.MAC}) || !slices.Equal(d.Addresses, []netip.Addr{static}) {
		t.Errorf("domain %+v, want owner %+v, MAC %s, address %s", d, spec.Owner, spec.MAC, static)
	}
	info, err := e.c.DomainInfo(ctx, spec.Name)
	if err != nil || !slices.Equal(info.StaticAddresses, []netip.Addr{static}) {
		t.Errorf("DomainInfo's static addresses %v (err %v), want %s", info.StaticAddresses, err, static)
	}

	onBridge, err := e.c.SegmentUse(ctx, "", bridge)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(onBridge.Own, bridgeAddr.Addr()) || len(onBridge.Domains) != 0 {
		t.Errorf("bridge %s: %+v, want its address %s and no domain", bridge, onBridge, bridgeAddr.Addr())
	}
}
