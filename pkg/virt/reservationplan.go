package virt

import (
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/leases"
)

// reservationLease is the DHCP lease time written into every host entry we
// add. dnsmasq keeps a deleted VM's lease until it expires and meanwhile
// refuses to hand that IP to the MAC it is now reserved for ("not using
// configured address ... because it is leased to ..."); libvirt offers no
// call to drop a lease, so a short lease is what bounds that window.
// Guests renew at half of it, a negligible amount of traffic.
const reservationLease = 10 * time.Minute

// dhcpLease is a lease as the engine uses it.
type dhcpLease = leases.Lease

// reservationPlan is what ReserveAddress has to do.
type reservationPlan struct {
	ip        netip.Addr
	addLive   bool
	addConfig bool
}

// reservationState is one view (live or persistent config) of a network's
// host entries; nil when that view does not exist (inactive or transient
// network).
type reservationState = *[]Reservation

// planReservation decides the IP for r and which definitions still lack
// its host entry. It is idempotent: a MAC already reserved keeps its IP.
// An IP is only handed to a new MAC when no other MAC holds it, neither as
// reservation nor as a current lease, because dnsmasq would otherwise
// silently give the guest some other address.
func planReservation(network string, subnet netip.Prefix, live, config reservationState, leases []dhcpLease, r Reservation, now time.Time) (reservationPlan, error) {
	conflict := func(reason AddressConflictReason, ip netip.Addr, heldBy string) error {
		return &AddressConflictError{Network: network, MAC: r.MAC, IP: ip, Reason: reason, HeldBy: heldBy}
	}
	var all []Reservation
	for _, s := range []reservationState{live, config} {
		if s != nil {
			all = append(all, *s...)
		}
	}
	var plan reservationPlan
	for _, h := range all {
		switch {
		case h.MAC == r.MAC:
			if plan.ip.IsValid() && plan.ip != h.IP {
				return plan, conflict(ConflictMACReserved, h.IP, fmt.Sprintf("%s and %s in the live and persistent definitions", plan.ip, h.IP))
			}
			plan.ip = h.IP
		case r.Hostname != "" && h.Hostname == r.Hostname:
			return plan, conflict(ConflictHostnameReserved, h.IP, h.MAC.String())
		}
	}
	if plan.ip.IsValid() && r.IP.IsValid() && r.IP != plan.ip {
		return plan, conflict(ConflictMACReserved, plan.ip, r.MAC.String())
	}
	if !plan.ip.IsValid() {
		ip, err := chooseAddress(network, subnet, all, leases, r, now)
		if err != nil {
			return plan, err
		}
		plan.ip = ip
	}
	plan.addLive = live != nil && !hasMAC(*live, r.MAC)
	plan.addConfig = config != nil && !hasMAC(*config, r.MAC)
	return plan, nil
}

// chooseAddress picks the IP for a MAC that has no reservation yet.
func chooseAddress(network string, subnet netip.Prefix, hosts []Reservation, leases []dhcpLease, r Reservation, now time.Time) (netip.Addr, error) {
	conflict := func(reason AddressConflictReason, ip netip.Addr, heldBy string) (netip.Addr, error) {
		return netip.Addr{}, &AddressConflictError{Network: network, MAC: r.MAC, IP: ip, Reason: reason, HeldBy: heldBy}
	}
	if r.IP.IsValid() {
		start, end := netalloc.DHCPRange(subnet)
		if !subnet.Contains(r.IP) || r.IP.Less(start) || end.Less(r.IP) {
			return conflict(ConflictOutsideSubnet, r.IP, fmt.Sprintf("%s (usable %s-%s)", subnet, start, end))
		}
		for _, h := range hosts {
			if h.IP == r.IP {
				return conflict(ConflictIPReserved, r.IP, h.MAC.String())
			}
		}
		for _, l := range leases {
			if l.IP == r.IP && l.Current(now) && l.MAC != r.MAC {
				err := &AddressConflictError{Network: network, MAC: r.MAC, IP: r.IP, Reason: ConflictLeased, HeldBy: l.MAC.String(), Until: l.Expiry}
				return netip.Addr{}, err
			}
		}
		return r.IP, nil
	}
	used := make([]netip.Addr, 0, len(hosts)+len(leases))
	for _, h := range hosts {
		used = append(used, h.IP)
	}
	var own []netip.Addr
	for _, l := range leases {
		if !l.Current(now) {
			continue
		}
		if l.MAC == r.MAC {
			own = append(own, l.IP)
			continue
		}
		used = append(used, l.IP)
	}
	// A guest that already holds a lease keeps its address: pinning it
	// elsewhere would renumber a running machine.
	for _, ip := range own {
		if subnet.Contains(ip) && !containsAddr(used, ip) {
			return ip, nil
		}
	}
	ip, err := netalloc.NextFreeAddress(subnet, used)
	if err != nil {
		return netip.Addr{}, &AddressConflictError{Network: network, MAC: r.MAC, Reason: ConflictNoFreeAddress, HeldBy: err.Error()}
	}
	return ip, nil
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}

func hasMAC(hosts []Reservation, mac netalloc.MAC) bool {
	_, ok := findMAC(hosts, mac)
	return ok
}

func findMAC(hosts []Reservation, mac netalloc.MAC) (Reservation, bool) {
	for _, h := range hosts {
		if h.MAC == mac {
			return h, true
		}
	}
	return Reservation{}, false
}

// mergeReservations lists the union of the live and persistent host
// entries, each MAC once, sorted by IP.
func mergeReservations(views ...[]Reservation) []Reservation {
	var out []Reservation
	for _, v := range views {
		for _, h := range v {
			if !hasMAC(out, h.MAC) {
				out = append(out, h)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out
}
