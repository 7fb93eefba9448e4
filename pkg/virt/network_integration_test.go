package virt_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// networkEnv is a client plus a raw connection the assertions use, so they
// do not trust the code under test.
type networkEnv struct {
	uri  string
	c    *virt.Client
	conn *libvirt.Connect
}

func newNetworkEnv(t *testing.T) networkEnv {
	t.Helper()
	uri := testlibvirt.URI(t)
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Close() })
	return networkEnv{uri: uri, c: testlibvirt.Client(t, uri), conn: conn}
}

// ensure creates a managed test network and removes it when t ends.
func (e networkEnv) ensure(t *testing.T, spec virt.NetworkSpec) virt.NetworkInfo {
	t.Helper()
	e.cleanupNetwork(t, spec.Name)
	info, err := e.c.EnsureNetwork(testCtx(t), spec)
	if err != nil {
		t.Fatalf("EnsureNetwork(%s): %v", spec.Name, err)
	}
	return info
}

func testNetworkSpec(t *testing.T) virt.NetworkSpec {
	name := testlibvirt.Name(t)
	return virt.NetworkSpec{Name: name, Owner: virt.Owner{Kind: "LibvirtCluster", Namespace: "capltest", Name: name, UID: "uid-" + name, Cluster: name}}
}

// cleanupNetwork destroys and undefines a test network when t ends, with
// the raw connection.
func (e networkEnv) cleanupNetwork(t *testing.T, name string) {
	t.Helper()
	if !strings.HasPrefix(name, virt.TestNamePrefix) {
		t.Fatalf("refusing to clean up non-test network %q", name)
	}
	t.Cleanup(func() {
		net, err := e.conn.LookupNetworkByName(name)
		if err != nil {
			if !virt.IsNotFound(err) {
				t.Errorf("cleanup: looking up network %s: %v", name, err)
			}
			return
		}
		defer net.Free()
		if active, _ := net.IsActive(); active {
			if err := net.Destroy(); err != nil {
				t.Errorf("cleanup: destroying network %s: %v", name, err)
			}
		}
		if persistent, _ := net.IsPersistent(); persistent {
			if err := net.Undefine(); err != nil {
				t.Errorf("cleanup: undefining network %s: %v", name, err)
			}
		}
	})
}

// defineRaw defines a network that is not ours (no metadata) and leaves it
// inactive.
func (e networkEnv) defineRaw(t *testing.T, name string, subnet netip.Prefix) {
	t.Helper()
	e.cleanupNetwork(t, name)
	def := libvirtxml.Network{
		Name:   name,
		Bridge: &libvirtxml.NetworkBridge{Name: netalloc.BridgeName(name)},
		IPs:    []libvirtxml.NetworkIP{{Address: netalloc.Gateway(subnet).String(), Prefix: uint(subnet.Bits())}},
	}
	doc, err := def.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	net, err := e.conn.NetworkDefineXML(doc)
	if err != nil {
		t.Fatalf("defining %s: %v", name, err)
	}
	_ = net.Free()
}

// xml returns a network's live or persistent definition.
func (e networkEnv) xml(t *testing.T, name string, flags libvirt.NetworkXMLFlags) libvirtxml.Network {
	t.Helper()
	net, err := e.conn.LookupNetworkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	doc, err := net.GetXMLDesc(flags)
	if err != nil {
		t.Fatal(err)
	}
	var x libvirtxml.Network
	if err := x.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	return x
}

// hosts returns the DHCP host entries of both definitions.
func (e networkEnv) hosts(t *testing.T, name string) (live, config []libvirtxml.NetworkDHCPHost) {
	t.Helper()
	get := func(flags libvirt.NetworkXMLFlags) []libvirtxml.NetworkDHCPHost {
		x := e.xml(t, name, flags)
		if len(x.IPs) == 0 || x.IPs[0].DHCP == nil {
			return nil
		}
		return x.IPs[0].DHCP.Hosts
	}
	return get(0), get(libvirt.NETWORK_XML_INACTIVE)
}

func (e networkEnv) state(t *testing.T, name string) (exists, active, autostart bool) {
	t.Helper()
	net, err := e.conn.LookupNetworkByName(name)
	if virt.IsNotFound(err) {
		return false, false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	active, _ = net.IsActive()
	autostart, _ = net.GetAutostart()
	return true, active, autostart
}

func (e networkEnv) destroy(t *testing.T, name string) {
	t.Helper()
	net, err := e.conn.LookupNetworkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	if err := net.Destroy(); err != nil {
		t.Fatal(err)
	}
}

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

func TestDeleteNetworkRefusedWhileDomainRefersToIt(t *testing.T) {
	e := newNetworkEnv(t)
	spec := testNetworkSpec(t)
	e.ensure(t, spec)
	ctx := testCtx(t)

	// A defined, never started domain is enough to refuse: it would fail
	// to start later.
	domName := spec.Name + "-dom"
	dom := libvirtxml.Domain{
		Type: "qemu", Name: domName,
		Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
		Devices: &libvirtxml.DomainDeviceList{Interfaces: []libvirtxml.DomainInterface{{
			Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: spec.Name}},
		}}},
	}
	doc, err := dom.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.conn.DomainDefineXML(doc)
	if err != nil {
		t.Fatal(err)
	}
	undefine := func() {
		if d != nil {
			_ = d.Undefine()
			_ = d.Free()
			d = nil
		}
	}
	t.Cleanup(undefine)

	err = e.c.DeleteNetwork(ctx, spec.Name)
	var ie *virt.NetworkInUseError
	if !errors.As(err, &ie) || !errors.Is(err, virt.ErrNetworkInUse) || len(ie.Domains) != 1 || ie.Domains[0] != domName {
		t.Fatalf("DeleteNetwork with a domain on it: %v", err)
	}
	if exists, active, _ := e.state(t, spec.Name); !exists || !active {
		t.Fatal("refused delete changed the network")
	}

	undefine()
	if err := e.c.DeleteNetwork(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if exists, _, _ := e.state(t, spec.Name); exists {
		t.Fatal("network still exists")
	}
	if err := e.c.DeleteNetwork(ctx, spec.Name); err != nil {
		t.Fatalf("deleting a missing network: %v", err)
	}
}

func TestUseBridge(t *testing.T) {
	e := newNetworkEnv(t)
	name := testlibvirt.Name(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := netlink.LinkAdd(br); err != nil {
		testprereq.Missing(t, "cannot create a test bridge here (needs root): %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(br) })
	info, err := e.c.UseBridge(testCtx(t), name)
	if err != nil || info.Bridge != name || info.Name != "" || info.Managed || info.DHCP {
		t.Fatalf("UseBridge: %+v, %v", info, err)
	}
	if _, err := e.c.UseBridge(testCtx(t), name+"x"); !virt.IsNotFound(err) {
		t.Fatalf("UseBridge(missing) = %v", err)
	}
	if _, err := e.c.UseBridge(testCtx(t), "lo"); err == nil {
		t.Fatal("UseBridge(lo) accepted a non-bridge")
	}
	if _, err := e.c.Addresses(testCtx(t), virt.AddressQuery{MAC: testMAC(t)}); err == nil {
		t.Fatal("Addresses on a bridge without a domain succeeded")
	}
}

// TestLeaseEventsAndStaleLease drives the lease path with a real DHCP
// exchange against libvirt's dnsmasq, and shows what a deleted machine's
// lease does to re-pinning its IP.
func TestLeaseEventsAndStaleLease(t *testing.T) {
	e := newNetworkEnv(t)
	spec := testNetworkSpec(t)
	info := e.ensure(t, spec)
	ctx := testCtx(t)
	macA, macB := testMAC(t), testMAC(t)
	hwA, _ := net.ParseMAC(macA.String())
	hwB, _ := net.ParseMAC(macB.String())
	clientA := newDHCPTestClient(t, info.Bridge, hwA)

	ipA, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macA, Hostname: "capltest-a"})
	if err != nil {
		t.Fatal(err)
	}
	events := e.c.Subscribe(ctx)
	watchCtx, stopWatch := context.WithTimeout(ctx, time.Minute)
	defer stopWatch()
	if err := e.c.WatchLease(watchCtx, spec.Name, netalloc.MAC(strings.ToUpper(macA.String()))); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := clientA.acquire("debian")
	if err != nil {
		t.Fatal(err)
	}
	if got != ipA {
		t.Fatalf("DHCP gave %s, reserved %s", got, ipA)
	}
	// Lease events carry no domain UUID; only macA is watched here.
	ev := waitEvent(t, events, virt.EventLease, "")
	t.Logf("lease event %v after the DHCP ACK", time.Since(start).Round(time.Millisecond))
	if ev.MAC != macA || ev.IP != ipA.String() || ev.Network != spec.Name || ev.Detail != virt.LeaseAcquired {
		t.Fatalf("lease event %+v", ev)
	}
	addrs, err := e.c.Addresses(ctx, virt.AddressQuery{Network: spec.Name, MAC: netalloc.MAC(strings.ToUpper(macA.String()))})
	if err != nil || len(addrs) != 1 || addrs[0].IP != ipA || addrs[0].Source != virt.AddressSourceLease {
		t.Fatalf("Addresses: %+v, %v", addrs, err)
	}

	// The machine is deleted without a graceful shutdown: its reservation
	// goes, its lease stays in dnsmasq. Pinning that IP to a new MAC now
	// would make dnsmasq give the new guest some other address ("not using
	// configured address ... because it is leased to ..."), so it is
	// refused with the lease's expiry, which the short lease time bounds.
	if err := e.c.ReleaseAddress(ctx, spec.Name, macA); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macB, IP: ipA})
	ae := assertAddressConflict(t, err, virt.ConflictLeased)
	if !netalloc.SameMAC(ae.HeldBy, macA.String()) || ae.Until.Before(time.Now()) || ae.Until.After(time.Now().Add(11*time.Minute)) {
		t.Fatalf("stale lease conflict %+v: want held by %s, expiring within the reservation lease time", ae, macA)
	}
	t.Logf("stale lease: %v", ae)
	// Left to choose, ReserveAddress avoids the leased IP.
	other, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macB})
	if err != nil || other == ipA {
		t.Fatalf("automatic reservation: %s, %v (stale lease on %s)", other, err, ipA)
	}
	if err := e.c.ReleaseAddress(ctx, spec.Name, macB); err != nil {
		t.Fatal(err)
	}

	// A guest that shuts down gracefully releases its lease; then the IP can
	// be pinned to the new MAC at once and the new guest gets it.
	if err := clientA.release(ipA); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the released lease to disappear", func() bool {
		addrs, err := e.c.Addresses(ctx, virt.AddressQuery{Network: spec.Name, MAC: macA})
		return err == nil && len(addrs) == 0
	})
	if got, err := e.c.ReserveAddress(ctx, spec.Name, virt.Reservation{MAC: macB, IP: ipA}); err != nil || got != ipA {
		t.Fatalf("re-pinning after release: %s, %v", got, err)
	}
	clientB := newDHCPTestClient(t, info.Bridge, hwB)
	if got, err := clientB.acquire("debian"); err != nil || got != ipA {
		t.Fatalf("new guest got %s, %v; want the re-pinned %s", got, err, ipA)
	}
	if err := e.c.ReleaseAddress(ctx, spec.Name, macB); err != nil {
		t.Fatal(err)
	}

	// A network that does not exist cannot be watched.
	if err := e.c.WatchLease(ctx, "capltest-nosuchnet", macA); !virt.IsNotFound(err) {
		t.Fatalf("WatchLease on a missing network: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
