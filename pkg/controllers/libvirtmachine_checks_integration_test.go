package controllers_test

import (
	"context"
	"encoding/base64"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// assertClean fails when anything of the named machine is left in libvirt:
// its domain, overlay, data disks, seed, console log or DHCP host entry.
// A DHCP entry is found on the test network's live and persistent
// definitions, read through a connection of the test's own, by the name
// the provider gives the machine's entries (virt.ReservationName), and by
// macs: those the machine had (machineMACs, read before its deletion).
func (h *harness) assertClean(name string, macs ...string) {
	h.t.Helper()
	h.assertNoDomainOrVolumes(name)
	h.assertNoDHCPEntry(name, macs...)
}

// assertNoDomainOrVolumes fails when the named machine has a domain or a
// volume in libvirt.
func (h *harness) assertNoDomainOrVolumes(name string) {
	h.t.Helper()
	domain := naming.DomainName(h.ns, name)
	if _, err := h.host.DomainInfo(h.ctx, domain); !virt.IsNotFound(err) {
		h.t.Errorf("domain %s left behind (err %v)", domain, err)
	}
	for _, vol := range h.poolVolumes() {
		if naming.IsDataDiskVolumeOf(domain, vol) {
			h.t.Errorf("data disk %s left behind", vol)
		}
	}
	for _, vol := range []string{naming.OverlayVolumeName(domain), naming.SeedVolumeName(domain), naming.ConsoleLogVolumeName(domain)} {
		if _, err := h.host.VolumeInfo(h.ctx, h.pool, vol); !virt.IsNotFound(err) {
			h.t.Errorf("volume %s left behind (err %v)", vol, err)
		}
	}
}

// assertNoDHCPEntry fails when the test network has a DHCP host entry
// named for the machine, or for one of macs.
func (h *harness) assertNoDHCPEntry(name string, macs ...string) {
	h.t.Helper()
	owned := virt.ReservationName(virt.Owner{Kind: "LibvirtMachine", Namespace: h.ns, Name: name})
	for _, e := range h.dhcpHosts() {
		if e.Name == owned {
			h.t.Errorf("DHCP entry %s (%s→%s) of %s left behind", e.Name, e.MAC, e.IP, name)
			continue
		}
		for _, mac := range macs {
			if mac != "" && netalloc.SameMAC(e.MAC, mac) {
				h.t.Errorf("DHCP entry %s→%s (name %q) of %s's MAC left behind", e.MAC, e.IP, e.Name, name)
			}
		}
	}
}

// dhcpHosts are the DHCP host entries of the test network's live and
// persistent definitions, read through a connection of the test's own.
func (h *harness) dhcpHosts() []libvirtxml.NetworkDHCPHost {
	h.t.Helper()
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	defer conn.Close()
	net, err := conn.LookupNetworkByName(h.network.Name)
	must(h.t, err)
	defer net.Free()
	var out []libvirtxml.NetworkDHCPHost
	for _, flags := range []libvirt.NetworkXMLFlags{0, libvirt.NETWORK_XML_INACTIVE} {
		doc, err := net.GetXMLDesc(flags)
		must(h.t, err)
		var x libvirtxml.Network
		must(h.t, x.Unmarshal(doc))
		for _, ip := range x.IPs {
			if ip.DHCP == nil {
				continue
			}
			for _, e := range ip.DHCP.Hosts {
				if !slices.Contains(out, e) {
					out = append(out, e)
				}
			}
		}
	}
	return out
}

// machineMACs are the MACs the named machine has or had: its annotation,
// its status and its domain's interfaces, read through a connection of
// the test's own. Read them before deleting it.
func (h *harness) machineMACs(name string) []string {
	h.t.Helper()
	var macs []string
	lm := h.lm(name)
	if m := lm.Annotations[scope.MACAnnotation]; m != "" {
		macs = append(macs, m)
	}
	if lm.Status.Domain != nil && lm.Status.Domain.MAC != "" {
		macs = append(macs, lm.Status.Domain.MAC)
	}
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	defer conn.Close()
	dom, err := conn.LookupDomainByName(naming.DomainName(h.ns, name))
	if err != nil {
		return macs // no domain
	}
	defer dom.Free()
	doc, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE)
	must(h.t, err)
	var x libvirtxml.Domain
	must(h.t, x.Unmarshal(doc))
	if x.Devices != nil {
		for _, nic := range x.Devices.Interfaces {
			if nic.MAC != nil {
				macs = append(macs, nic.MAC.Address)
			}
		}
	}
	return macs
}

// deleteAndAssertClean deletes each machine and checks that nothing of
// it is left: its domain, volumes and DHCP entries (by name and by the
// MACs it had).
func (h *harness) deleteAndAssertClean(names ...string) {
	h.t.Helper()
	for _, name := range names {
		macs := h.machineMACs(name)
		h.deleteMachine(name, time.Minute)
		h.assertClean(name, macs...)
	}
}

// assertNoLibvirtObjects checks that nothing was created for a machine:
// no MAC chosen (status or annotation), no domain, volume or DHCP entry.
func (h *harness) assertNoLibvirtObjects(name string) {
	h.t.Helper()
	macs := h.machineMACs(name)
	if len(macs) > 0 {
		h.t.Errorf("%s chose a MAC (%v) while it should wait", name, macs)
	}
	h.assertClean(name, macs...)
}

// poolVolumes lists the test pool's volume names through a connection of
// its own.
func (h *harness) poolVolumes() []string {
	h.t.Helper()
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	defer conn.Close()
	pool, err := conn.LookupStoragePoolByName(h.pool)
	must(h.t, err)
	defer pool.Free()
	must(h.t, pool.Refresh(0))
	names, err := pool.ListStorageVolumes()
	must(h.t, err)
	sort.Strings(names)
	return names
}

// leaseIP is the address dnsmasq leased to mac, if any.
func (h *harness) leaseIP(mac string) (netip.Addr, bool) {
	addrs, err := h.host.Addresses(h.ctx, virt.AddressQuery{Network: h.network.Name, MAC: netalloc.MAC(mac)})
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		if a.Source == virt.AddressSourceLease {
			return a.IP, true
		}
	}
	return netip.Addr{}, false
}

// destroyBehindOurBack destroys and undefines a domain outside the provider.
func (h *harness) destroyBehindOurBack(domain string) {
	h.t.Helper()
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	defer conn.Close()
	dom, err := conn.LookupDomainByName(domain)
	must(h.t, err)
	defer dom.Free()
	if err := dom.Destroy(); err != nil {
		h.t.Logf("destroy: %v", err)
	}
	must(h.t, dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM))
}

// assertNoSecretLeaks checks events and controller logs for bootstrap data.
func (h *harness) assertNoSecretLeaks() {
	h.t.Helper()
	events := &corev1.EventList{}
	must(h.t, h.c.List(h.ctx, events, client.InNamespace(h.ns)))
	for _, ev := range events.Items {
		if strings.Contains(ev.Message, secretMarker) || strings.Contains(ev.Reason, secretMarker) {
			h.t.Errorf("event %s/%s leaks bootstrap data", ev.Reason, ev.Name)
		}
	}
	logs := h.logs.String()
	for _, needle := range leakNeedles() {
		if strings.Contains(logs, needle) {
			h.t.Errorf("controller logs leak bootstrap data %q (see %s)", needle, h.logPath)
		}
	}
	lms := &infrav1.LibvirtMachineList{}
	must(h.t, h.c.List(h.ctx, lms, client.InNamespace(h.ns)))
	for _, lm := range lms.Items {
		for _, c := range lm.Status.Conditions {
			if strings.Contains(c.Message, secretMarker) {
				h.t.Errorf("condition %s of %s leaks bootstrap data", c.Type, lm.Name)
			}
		}
	}
	h.t.Logf("checked %d events and %d bytes of logs for bootstrap data", len(events.Items), len(h.logs.String()))

	// Transitions were recorded as events.
	seen := map[string]bool{}
	for _, ev := range events.Items {
		if ev.InvolvedObject.Kind == "LibvirtMachine" {
			seen[ev.Reason] = true
		}
	}
	reasons := []string{"DomainDefined", "DomainStarted", infrav1.ImageNotFoundReason, infrav1.UnsupportedBootstrapFormatReason}
	if h.booted {
		reasons = append(reasons, "Provisioned", "TerminalFailure", infrav1.DomainMissingReason)
	}
	for _, reason := range reasons {
		if !seen[reason] {
			h.t.Errorf("no %s event on any LibvirtMachine", reason)
		}
	}
}

// cleanupMachines deletes every Machine left by a failed test, then
// destroys any domain of the test namespace the provider did not remove.
func (h *harness) cleanupMachines() {
	ctx := context.Background()
	machines := &clusterv1.MachineList{}
	if err := h.c.List(ctx, machines, client.InNamespace(h.ns)); err == nil && len(machines.Items) > 0 {
		h.mu.Lock()
		running := h.provider != nil
		h.mu.Unlock()
		if !running {
			h.startProvider(nil)
		}
		for i := range machines.Items {
			_ = h.c.Delete(ctx, &machines.Items[i])
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			left := &infrav1.LibvirtMachineList{}
			if err := h.c.List(ctx, left, client.InNamespace(h.ns)); err != nil || len(left.Items) == 0 {
				break
			}
			time.Sleep(time.Second)
		}
	}
	conn, err := libvirt.NewConnect(h.uri)
	if err != nil {
		return
	}
	defer conn.Close()
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return
	}
	for i := range doms {
		name, _ := doms[i].GetName()
		if strings.HasPrefix(name, naming.DomainName(h.ns, "")) {
			h.t.Errorf("force-removing domain %s left by the test", name)
			_ = doms[i].Destroy()
			_ = doms[i].UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM)
		}
		_ = doms[i].Free()
	}
}

// leakNeedles are the marker and what it looks like inside base64 at each
// of the three alignments (with the unstable edge characters cut off).
func leakNeedles() []string {
	out := []string{secretMarker}
	for pad := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, pad), secretMarker...))
		out = append(out, enc[4:len(enc)-4])
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
