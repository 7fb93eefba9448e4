package virt_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestEnsureNetworkIdempotentAndReused(t *testing.T) {
	e := newNetworkEnv(t)
	spec := testNetworkSpec(t)
	first := e.ensure(t, spec)
	if !first.Managed || !first.DHCP || !first.CIDR.IsValid() || first.Bridge != netalloc.BridgeName(spec.Name) ||
		first.Gateway != netalloc.Gateway(first.CIDR) || first.Owner == nil || *first.Owner != spec.Owner {
		t.Fatalf("first EnsureNetwork: %+v", first)
	}
	if exists, active, autostart := e.state(t, spec.Name); !exists || !active || !autostart {
		t.Fatalf("network exists=%v active=%v autostart=%v", exists, active, autostart)
	}
	// The owner is readable from the network's own definition.
	x := e.xml(t, spec.Name, libvirt.NETWORK_XML_INACTIVE)
	if x.Metadata == nil {
		t.Fatal("no <metadata> in the network definition")
	}
	if o, err := virt.ParseOwner(x.Metadata.XML); err != nil || *o != spec.Owner {
		t.Fatalf("owner in metadata: %+v, %v", o, err)
	}

	second, err := e.c.EnsureNetwork(testCtx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	if second.CIDR != first.CIDR || second.Bridge != first.Bridge || !second.Managed {
		t.Fatalf("second EnsureNetwork %+v differs from first %+v", second, first)
	}

	// Stopped behind our back (or the host rebooted without autostart):
	// the next Ensure starts it again with the same subnet.
	e.destroy(t, spec.Name)
	third, err := e.c.EnsureNetwork(testCtx(t), spec)
	if err != nil || third.CIDR != first.CIDR {
		t.Fatalf("EnsureNetwork of the stopped network: %+v, %v", third, err)
	}
	if _, active, _ := e.state(t, spec.Name); !active {
		t.Fatal("network not restarted")
	}

	// Asking for another CIDR does not silently renumber it.
	mismatch := spec
	mismatch.CIDR = netip.MustParsePrefix("10.239.251.0/24")
	_, err = e.c.EnsureNetwork(testCtx(t), mismatch)
	assertNetworkConflict(t, err, virt.ConflictSpecMismatch, first.CIDR.String())

	// Another owner of the same name is refused.
	other := spec
	other.Owner.Namespace = "elsewhere"
	_, err = e.c.EnsureNetwork(testCtx(t), other)
	assertNetworkConflict(t, err, virt.ConflictName, "capltest/")

	// UseNetwork reports it as not managed.
	used, err := e.c.UseNetwork(testCtx(t), spec.Name)
	if err != nil || used.Managed || used.CIDR != first.CIDR || !used.DHCP || used.Bridge != first.Bridge {
		t.Fatalf("UseNetwork: %+v, %v", used, err)
	}
}

func assertNetworkConflict(t *testing.T, err error, reason virt.NetworkConflictReason, mentions string) *virt.NetworkConflictError {
	t.Helper()
	var ce *virt.NetworkConflictError
	if !errors.As(err, &ce) || !errors.Is(err, virt.ErrNetworkConflict) {
		t.Fatalf("err = %v, want a NetworkConflictError", err)
	}
	if ce.Reason != reason || !strings.Contains(ce.Error(), mentions) {
		t.Fatalf("conflict %q (reason %s), want reason %s mentioning %q", ce.Error(), ce.Reason, reason, mentions)
	}
	return ce
}

func TestEnsureNetworkAvoidsInactiveNetworks(t *testing.T) {
	e := newNetworkEnv(t)

	// Learn which subnet the next network would get, then occupy it with
	// an inactive network that is not ours.
	probe := testNetworkSpec(t)
	next := e.ensure(t, probe).CIDR
	if err := e.c.DeleteNetwork(testCtx(t), probe.Name); err != nil {
		t.Fatal(err)
	}
	blocker := testlibvirt.Name(t)
	e.defineRaw(t, blocker, next)

	// An explicit request for it is a typed conflict naming the blocker,
	// and nothing is left defined.
	spec := testNetworkSpec(t)
	spec.CIDR = next
	e.cleanupNetwork(t, spec.Name)
	_, err := e.c.EnsureNetwork(testCtx(t), spec)
	ce := assertNetworkConflict(t, err, virt.ConflictSubnet, `libvirt network "`+blocker+`" (inactive)`)
	t.Logf("conflict: %v", ce)
	if exists, _, _ := e.state(t, spec.Name); exists {
		t.Fatal("a network was left defined after the conflict")
	}

	// Left to choose, it picks another subnet.
	spec.CIDR = netip.Prefix{}
	info := e.ensure(t, spec)
	if info.CIDR.Overlaps(next) {
		t.Fatalf("chose %s, which overlaps the inactive network's %s", info.CIDR, next)
	}

	// An unmanaged network that is not running cannot be used.
	if _, err := e.c.UseNetwork(testCtx(t), blocker); !errors.Is(err, virt.ErrNetworkInactive) {
		t.Fatalf("UseNetwork(inactive) = %v", err)
	}
	// Nor deleted by us.
	if err := e.c.DeleteNetwork(testCtx(t), blocker); !errors.Is(err, virt.ErrNetworkNotOwned) {
		t.Fatalf("DeleteNetwork(not ours) = %v", err)
	}
}

func TestEnsureNetworkHostConflict(t *testing.T) {
	e := newNetworkEnv(t)
	host, err := netalloc.HostPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	var taken netalloc.InUse
	for _, h := range host {
		if netalloc.ValidatePrefix(h.Prefix) == nil {
			taken = h
			break
		}
	}
	if !taken.Prefix.IsValid() {
		testprereq.Missing(t, "the host has no address or route usable as a network CIDR")
	}
	spec := testNetworkSpec(t)
	spec.CIDR = taken.Prefix
	e.cleanupNetwork(t, spec.Name)
	_, err = e.c.EnsureNetwork(testCtx(t), spec)
	ce := assertNetworkConflict(t, err, virt.ConflictSubnet, taken.Owner)
	t.Logf("conflict: %v", ce)
	if exists, _, _ := e.state(t, spec.Name); exists {
		t.Fatal("a network was left defined after the conflict")
	}
}

func TestReservations(t *testing.T) {
	e := newNetworkEnv(t)
	spec := testNetworkSpec(t)
	info := e.ensure(t, spec)
	ctx := testCtx(t)
	macA, macB := testMAC(t), testMAC(t)

	ipA, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: netalloc.MAC(strings.ToUpper(macA.String()))})
	if err != nil {
		t.Fatal(err)
	}
	if !info.CIDR.Contains(ipA) || ipA == info.Gateway {
		t.Fatalf("reserved %s outside %s", ipA, info.CIDR)
	}
	again, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macA})
	if err != nil || again != ipA {
		t.Fatalf("second reservation: %s, %v; want %s", again, err, ipA)
	}
	assertHost(t, e, spec.Name, macA, ipA, true, true)

	// The IP is not handed to another MAC.
	_, err = e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macB, IP: ipA})
	assertAddressConflict(t, err, virt.ConflictIPReserved)

	ipB := ipA.Next().Next()
	if got, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macB, IP: ipB, Hostname: "capltest-b"}); err != nil || got != ipB {
		t.Fatalf("explicit reservation: %s, %v", got, err)
	}
	_, err = e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: testMAC(t), Hostname: "capltest-b"})
	assertAddressConflict(t, err, virt.ConflictHostnameReserved)
	_, err = e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: testMAC(t), IP: netip.MustParseAddr("203.0.113.5")})
	assertAddressConflict(t, err, virt.ConflictOutsideSubnet)

	list, err := e.c.Reservations(ctx, spec.Name)
	if err != nil || len(list) != 2 || list[0].IP != ipA || list[1].IP != ipB || list[1].Hostname != "capltest-b" {
		t.Fatalf("Reservations: %+v, %v", list, err)
	}

	// Before any lease, Addresses reports the reservation as such.
	addrs, err := e.c.Addresses(ctx, virt.AddressQuery{Network: spec.Name, MAC: macA})
	if err != nil || len(addrs) != 1 || addrs[0].IP != ipA || addrs[0].Source != virt.AddressSourceReservation {
		t.Fatalf("Addresses: %+v, %v", addrs, err)
	}

	if err := e.c.ReleaseAddress(ctx, spec.Name, netalloc.MAC(strings.ToUpper(macA.String()))); err != nil {
		t.Fatal(err)
	}
	assertHost(t, e, spec.Name, macA, ipA, false, false)
	if err := e.c.ReleaseAddress(ctx, spec.Name, macA); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := e.c.ReleaseAddress(ctx, "capltest-nosuchnet", macA); err != nil {
		t.Fatalf("release on a missing network: %v", err)
	}

	// On a stopped network the entry goes into the persistent definition
	// only, and is live once the network runs again.
	e.destroy(t, spec.Name)
	macC := testMAC(t)
	ipC, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macC})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.EnsureNetwork(ctx, spec); err != nil {
		t.Fatal(err)
	}
	assertHost(t, e, spec.Name, macC, ipC, true, true)
	if err := e.c.ReleaseAddress(ctx, spec.Name, macC); err != nil {
		t.Fatal(err)
	}
	assertHost(t, e, spec.Name, macC, ipC, false, false)
}

func testMAC(t *testing.T) netalloc.MAC {
	t.Helper()
	mac, err := testlibvirt.NewMAC()
	if err != nil {
		t.Fatal(err)
	}
	return netalloc.CanonicalMAC(mac.String())
}

// assertHost checks a host entry's presence in the live and the persistent
// definition.
func assertHost(t *testing.T, e networkEnv, network string, mac netalloc.MAC, ip netip.Addr, wantLive, wantConfig bool) {
	t.Helper()
	live, config := e.hosts(t, network)
	find := func(hosts []libvirtxml.NetworkDHCPHost) bool {
		for _, h := range hosts {
			if netalloc.CanonicalMAC(h.MAC) == mac {
				if h.IP != ip.String() {
					t.Errorf("host entry %s has IP %s, want %s", mac, h.IP, ip)
				}
				if h.Lease == nil || h.Lease.Expiry == 0 {
					t.Errorf("host entry %s has no short lease time", mac)
				}
				return true
			}
		}
		return false
	}
	if got := find(live); got != wantLive {
		t.Errorf("host entry %s in live definition: %v, want %v", mac, got, wantLive)
	}
	if got := find(config); got != wantConfig {
		t.Errorf("host entry %s in persistent definition: %v, want %v", mac, got, wantConfig)
	}
}

func assertAddressConflict(t *testing.T, err error, reason virt.AddressConflictReason) *virt.AddressConflictError {
	t.Helper()
	var ae *virt.AddressConflictError
	if !errors.As(err, &ae) || !errors.Is(err, virt.ErrAddressConflict) || ae.Reason != reason {
		t.Fatalf("err = %v, want an AddressConflictError %s", err, reason)
	}
	return ae
}
