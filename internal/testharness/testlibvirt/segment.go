package testlibvirt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// OperatorNetwork makes a NAT network as an operator would for pool
// addresses: its DHCP server hands out only .2 to .99 of its /24 (the
// networks the provider makes hand out the whole subnet), so that the
// rest of the range is free for IPAM pools. It is deleted when the test
// ends, after before (the removal of the machines on it; nil for none).
func OperatorNetwork(t testing.TB, uri string, h *virt.Client, owner virt.Owner, before func()) virt.NetworkInfo {
	t.Helper()
	name := Name(t)
	owner.Name = name
	info, err := h.EnsureNetwork(context.Background(), virt.NetworkSpec{Name: name, Owner: owner,
		Candidates: []netip.Prefix{netip.MustParsePrefix("10.213.0.0/24"), netip.MustParsePrefix("10.214.0.0/24"), netip.MustParsePrefix("10.215.0.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if before != nil {
			before()
		}
		if err := h.DeleteNetwork(context.Background(), name); err != nil {
			t.Errorf("deleting the operator's network %s: %v", name, err)
		}
	})
	if info.CIDR.Bits() != 24 {
		t.Fatalf("network %s: range %s, want a /24", name, info.CIDR)
	}
	start, end := netalloc.DHCPRange(info.CIDR)
	octets := info.CIDR.Addr().As4()
	octets[3] = 99
	short := netip.AddrFrom4(octets)
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	net, err := conn.LookupNetworkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	flags := libvirt.NETWORK_UPDATE_AFFECT_LIVE | libvirt.NETWORK_UPDATE_AFFECT_CONFIG
	for _, u := range []struct {
		cmd        libvirt.NetworkUpdateCommand
		start, end netip.Addr
	}{{libvirt.NETWORK_UPDATE_COMMAND_DELETE, start, end}, {libvirt.NETWORK_UPDATE_COMMAND_ADD_LAST, start, short}} {
		doc, err := (&libvirtxml.NetworkDHCPRange{Start: u.start.String(), End: u.end.String()}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := net.Update(u.cmd, libvirt.NETWORK_SECTION_IP_DHCP_RANGE, -1, doc, flags); err != nil {
			t.Fatalf("narrowing the DHCP range of %s: %v", name, err)
		}
	}
	return info
}

// HostBridge makes a Linux bridge on this machine with address (when
// valid), up, as a homelab's br0 would be; it is deleted when the test
// ends. Domains may name it without being started.
func HostBridge(t testing.TB, address netip.Prefix) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := "tbr" + hex.EncodeToString(b) // 11 characters, not a provider bridge's name
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("link", "add", "name", name, "type", "bridge")
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting bridge %s: %v: %s", name, err, out)
		}
	})
	if address.IsValid() {
		run("addr", "add", address.String(), "dev", name)
	}
	run("link", "set", name, "up")
	return name
}
