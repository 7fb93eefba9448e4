package controllers_test

import (
	"context"
	"encoding/base64"
	"net/netip"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"libvirt.org/go/libvirt"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// assertClean fails when anything of the named machine is left in libvirt:
// its domain, overlay, data disks, seed, console log or DHCP host entry.
func (h *harness) assertClean(name, mac string) {
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
	entries, err := h.host.Reservations(h.ctx, h.network.Name)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range entries {
		if mac != "" && netalloc.SameMAC(e.MAC.String(), mac) {
			h.t.Errorf("reservation %s→%s left behind", e.MAC, e.IP)
		}
	}
}

// deleteAndAssertClean deletes each machine and checks that nothing of
// it is left: its domain, volumes and the DHCP entry of the MAC it had.
func (h *harness) deleteAndAssertClean(names ...string) {
	h.t.Helper()
	for _, name := range names {
		mac := ""
		if lm := h.lm(name); lm.Status.Domain != nil {
			mac = lm.Status.Domain.MAC
		}
		h.deleteMachine(name, time.Minute)
		h.assertClean(name, mac)
	}
}

// assertNoLibvirtObjects checks that nothing was created for a machine.
func (h *harness) assertNoLibvirtObjects(name string) {
	h.t.Helper()
	lm := h.lm(name)
	if lm.Status.Domain != nil && lm.Status.Domain.MAC != "" {
		h.t.Errorf("%s chose a MAC while it should wait", name)
	}
	h.assertClean(name, "")
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
