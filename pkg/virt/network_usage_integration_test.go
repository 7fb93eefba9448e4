package virt_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

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
