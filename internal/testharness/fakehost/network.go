package fakehost

import (
	"context"
	"net/netip"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/leases"
)

// The fake of virt.NetworkHost: reservations, leases and addresses.
var _ virt.NetworkHost = (*Host)(nil)

// ReserveAddress reserves the next free address of 192.168.100.0/24.
func (h *Host) ReserveAddress(_ context.Context, network string, r virt.Reservation) (netip.Addr, error) {
	if err := h.call("ReserveAddress"); err != nil {
		return netip.Addr{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.NoDHCP[network] {
		return netip.Addr{}, virt.ErrNoDHCP
	}
	entries, ok := h.Entries[network]
	if !ok {
		return netip.Addr{}, notFound("network " + network)
	}
	// As libvirt's client does, whatever the caller's case and style.
	r.MAC = r.MAC.Canonical()
	used := []netip.Addr{}
	for _, e := range entries {
		if e.MAC == r.MAC {
			return e.IP, nil
		}
		used = append(used, e.IP)
	}
	ip, err := netalloc.NextFreeAddress(netip.MustParsePrefix("192.168.100.0/24"), used)
	if err != nil {
		return netip.Addr{}, err
	}
	h.Entries[network] = append(entries, virt.Reservation{MAC: r.MAC, IP: ip})
	return ip, nil
}

// ReleaseOwnedAddress removes r.MAC's entry; the fake records no owners.
func (h *Host) ReleaseOwnedAddress(ctx context.Context, network string, r virt.Reservation) error {
	return h.release("ReleaseOwnedAddress", network, r.MAC)
}

// ReleaseAddress removes mac's entry.
func (h *Host) ReleaseAddress(_ context.Context, network string, mac netalloc.MAC) error {
	return h.release("ReleaseAddress", network, mac)
}

func (h *Host) release(method, network string, mac netalloc.MAC) error {
	mac = mac.Canonical()
	if err := h.call(method); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var keep []virt.Reservation
	for _, e := range h.Entries[network] {
		if e.MAC != mac {
			keep = append(keep, e)
		}
	}
	if _, ok := h.Entries[network]; ok {
		h.Entries[network] = keep
	}
	return nil
}

// Reservations lists a network's entries.
func (h *Host) Reservations(_ context.Context, network string) ([]virt.Reservation, error) {
	if err := h.call("Reservations"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.NoDHCP[network] {
		return nil, virt.ErrNoDHCP
	}
	entries, ok := h.Entries[network]
	if !ok {
		return nil, notFound("network " + network)
	}
	// As libvirt's client reads them: in canonical form, whatever case a
	// test wrote them in.
	out := make([]virt.Reservation, 0, len(entries))
	for _, e := range entries {
		e.MAC = e.MAC.Canonical()
		out = append(out, e)
	}
	return out, nil
}

// Addresses reports leases first, then the reservation.
func (h *Host) Addresses(_ context.Context, q virt.AddressQuery) ([]virt.Address, error) {
	if err := h.call("Addresses"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []virt.Address
	for mac, ip := range h.Leases[q.Network] {
		if netalloc.CanonicalMAC(mac) == q.MAC.Canonical() {
			out = append(out, virt.Address{IP: ip, Source: virt.AddressSourceLease})
		}
	}
	for _, e := range h.Entries[q.Network] {
		if e.MAC == q.MAC.Canonical() && (len(out) == 0 || out[0].IP != e.IP) {
			out = append(out, virt.Address{IP: e.IP, Source: virt.AddressSourceReservation})
		}
	}
	return out, nil
}

// WatchLease records the call.
func (h *Host) WatchLease(_ context.Context, network string, mac netalloc.MAC) error {
	if err := h.call("WatchLease"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Watches = append(h.Watches, network+"/"+mac.Canonical().String())
	return nil
}

// SegmentUse reports the network's entries and leases, and the domains
// EnsureDomain defined on network or bridge with their MAC, owner and
// static addresses; the fake network's gateway is 192.168.100.1 and its
// DHCP range .2–.254.
func (h *Host) SegmentUse(_ context.Context, network, bridge string) (virt.SegmentUse, error) {
	if err := h.call("SegmentUse"); err != nil {
		return virt.SegmentUse{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var use virt.SegmentUse
	if network != "" {
		entries, ok := h.Entries[network]
		if !ok {
			return use, notFound("network " + network)
		}
		use.Own = []netip.Addr{netip.MustParseAddr("192.168.100.1")}
		use.DHCPRanges = []virt.AddressRange{{Start: netip.MustParseAddr("192.168.100.2"), End: netip.MustParseAddr("192.168.100.254")}}
		use.Reservations = append(use.Reservations, entries...)
		for mac, ip := range h.Leases[network] {
			use.Leases = append(use.Leases, leases.Lease{MAC: netalloc.CanonicalMAC(mac), IP: ip})
		}
	}
	for name, spec := range h.Specs {
		if (network != "" && spec.Network == network) || (bridge != "" && spec.Bridge == bridge) {
			owner := spec.Owner
			use.Domains = append(use.Domains, virt.SegmentDomain{Name: name, Owner: &owner,
				MACs: []netalloc.MAC{spec.MAC.Canonical()}, Addresses: spec.StaticAddresses})
		}
	}
	return use, nil
}
