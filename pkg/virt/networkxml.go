package virt

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// reservationLease is the DHCP lease time written into every host entry we
// add. dnsmasq keeps a deleted VM's lease until it expires and meanwhile
// refuses to hand that IP to the MAC it is now reserved for ("not using
// configured address ... because it is leased to ..."); libvirt offers no
// call to drop a lease, so a short lease is what bounds that window.
// Guests renew at half of it, a negligible amount of traffic.
const reservationLease = 10 * time.Minute

// networkXML builds the definition of a NAT network whose DHCP server hands
// out the whole subnet except the gateway, with our owner in <metadata> so
// that orphan listing and DeleteNetwork recognise it.
func networkXML(spec NetworkSpec, bridge string, subnet netip.Prefix) (*libvirtxml.Network, error) {
	owner, err := spec.Owner.MetadataXML()
	if err != nil {
		return nil, err
	}
	start, end := netalloc.DHCPRange(subnet)
	return &libvirtxml.Network{
		Name:     spec.Name,
		Metadata: &libvirtxml.NetworkMetadata{XML: owner},
		Forward:  &libvirtxml.NetworkForward{Mode: "nat"},
		// STP off and no forward delay: the bridge has only VM ports, and a
		// delay would hold back the first DHCP packets of every new guest.
		Bridge: &libvirtxml.NetworkBridge{Name: bridge, STP: "off", Delay: "0"},
		IPs: []libvirtxml.NetworkIP{{
			Address: netalloc.Gateway(subnet).String(),
			Prefix:  uint(subnet.Bits()),
			DHCP: &libvirtxml.NetworkDHCP{
				Ranges: []libvirtxml.NetworkDHCPRange{{Start: start.String(), End: end.String()}},
			},
		}},
	}, nil
}

// hostEntryXML renders the <host> element that virNetworkUpdate adds to a
// network's DHCP section: it pins ip to mac (and names it in the network's
// DNS when hostname is set).
func hostEntryXML(mac string, ip netip.Addr, hostname string) (string, error) {
	h := libvirtxml.NetworkDHCPHost{
		MAC:   mac,
		IP:    ip.String(),
		Name:  hostname,
		Lease: &libvirtxml.NetworkDHCPLease{Expiry: uint(reservationLease / time.Minute), Unit: "minutes"},
	}
	return h.Marshal()
}

// hostDeleteXML renders the <host> element that selects an entry for
// deletion: libvirt matches on every attribute given, so only the MAC is.
func hostDeleteXML(mac string) (string, error) {
	h := libvirtxml.NetworkDHCPHost{MAC: mac}
	return h.Marshal()
}

// networkFacts is what the engine needs from a network definition.
type networkFacts struct {
	name    string
	bridge  string
	forward string
	// owner is nil unless the network carries our metadata.
	owner *Owner
	// subnet is the first IPv4 <ip>; zero when there is none (a bridged or
	// isolated network without addressing).
	subnet netip.Prefix
	// ipIndex is the position of that <ip> among all <ip> elements, the
	// parentIndex virNetworkUpdate wants.
	ipIndex int
	// dhcp tells whether libvirt's dnsmasq serves DHCP on subnet.
	dhcp bool
	// hosts are the DHCP host entries of subnet.
	hosts []Reservation
	// prefixes are all IPv4 prefixes the network claims.
	prefixes []netip.Prefix
}

// parseNetwork reads a network's XML description.
func parseNetwork(doc string) (networkFacts, error) {
	var n libvirtxml.Network
	if err := n.Unmarshal(doc); err != nil {
		return networkFacts{}, fmt.Errorf("parsing network XML: %w", err)
	}
	f := networkFacts{name: n.Name, ipIndex: -1}
	if n.Bridge != nil {
		f.bridge = n.Bridge.Name
	}
	if n.Forward != nil {
		f.forward = n.Forward.Mode
	}
	if n.Metadata != nil {
		if o, err := ParseOwner(n.Metadata.XML); err == nil {
			f.owner = o
		}
	}
	for i, ip := range n.IPs {
		p, ok := ipPrefix(ip)
		if !ok || !p.Addr().Is4() {
			continue
		}
		f.prefixes = append(f.prefixes, p.Masked())
		if f.ipIndex >= 0 {
			continue
		}
		f.ipIndex, f.subnet = i, p.Masked()
		if ip.DHCP == nil {
			continue
		}
		f.dhcp = len(ip.DHCP.Ranges) > 0 || len(ip.DHCP.Hosts) > 0
		for _, h := range ip.DHCP.Hosts {
			addr, _ := netip.ParseAddr(h.IP)
			f.hosts = append(f.hosts, Reservation{MAC: h.MAC, IP: addr, Hostname: h.Name})
		}
	}
	return f, nil
}

// ipPrefix reads an <ip> element, which gives its length either as prefix
// or as netmask.
func ipPrefix(ip libvirtxml.NetworkIP) (netip.Prefix, bool) {
	addr, err := netip.ParseAddr(ip.Address)
	if err != nil {
		return netip.Prefix{}, false
	}
	bits := int(ip.Prefix)
	if ip.Netmask != "" {
		m, err := netip.ParseAddr(ip.Netmask)
		if err != nil {
			return netip.Prefix{}, false
		}
		bits, _ = net.IPMask(m.AsSlice()).Size()
	} else if ip.Prefix == 0 {
		// libvirt's defaults when neither is given.
		bits = 24
		if addr.Is6() {
			bits = 64
		}
	}
	p, err := addr.Prefix(bits)
	return p, err == nil
}

// libvirtNetwork is one network of the host as conflict detection sees it.
type libvirtNetwork struct {
	facts  networkFacts
	active bool
}

// networksInUse describes the prefixes other libvirt networks claim, active
// or not: libvirt itself only notices an overlap when the second network
// starts, long after a controller has reported success.
func networksInUse(nets []libvirtNetwork, self string) []netalloc.InUse {
	var out []netalloc.InUse
	for _, n := range nets {
		if n.facts.name == self {
			continue
		}
		for _, p := range n.facts.prefixes {
			out = append(out, netalloc.InUse{Prefix: p, Owner: describeNetwork(n)})
		}
	}
	return out
}

func describeNetwork(n libvirtNetwork) string {
	state := "inactive"
	if n.active {
		state = "active"
	}
	return fmt.Sprintf("libvirt network %q (%s)", n.facts.name, state)
}

// bridgeTaken names the other libvirt network that already uses bridge.
func bridgeTaken(nets []libvirtNetwork, self, bridge string) (string, bool) {
	for _, n := range nets {
		if n.facts.name != self && n.facts.bridge == bridge {
			return describeNetwork(n), true
		}
	}
	return "", false
}

// startConflict recognises libvirt refusing to start a network because its
// subnet or bridge collides with something on the host. The message is
// libvirt's, e.g. "internal error: Network is already in use by interface
// eth0".
func startConflict(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "already in use") || strings.Contains(m, "file exists")
}

// sameOwner tells whether an existing network belongs to the object now
// ensuring it. The UID is deliberately not compared: clusterctl move
// recreates the objects with new UIDs, and the network must survive that.
func sameOwner(a, b Owner) bool {
	return a.Kind == b.Kind && a.Namespace == b.Namespace && a.Name == b.Name && a.Cluster == b.Cluster
}

// interfaceUses tells whether a domain's XML has an interface attached to
// the libvirt network named network or directly to bridge.
func interfaceUses(doc, network, bridge string) (bool, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(doc); err != nil {
		return false, fmt.Errorf("parsing domain XML: %w", err)
	}
	if d.Devices == nil {
		return false, nil
	}
	for _, iface := range d.Devices.Interfaces {
		src := iface.Source
		if src == nil {
			continue
		}
		if src.Network != nil && src.Network.Network == network {
			return true, nil
		}
		if bridge != "" && src.Bridge != nil && src.Bridge.Bridge == bridge {
			return true, nil
		}
	}
	return false, nil
}

// dhcpLease is a lease as the engine uses it.
type dhcpLease struct {
	MAC      string
	IP       netip.Addr
	Hostname string
	// Expiry is zero for a lease that never expires.
	Expiry time.Time
}

// current tells whether a lease is worth reporting: unexpired and not
// link-local (a guest's IPv6 link-local address says nothing about where
// to reach it).
func (l dhcpLease) current(now time.Time) bool {
	if !l.IP.IsValid() || l.IP.IsLinkLocalUnicast() {
		return false
	}
	return l.Expiry.IsZero() || l.Expiry.After(now)
}

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
		case netalloc.SameMAC(h.MAC, r.MAC):
			if plan.ip.IsValid() && plan.ip != h.IP {
				return plan, conflict(ConflictMACReserved, h.IP, fmt.Sprintf("%s and %s in the live and persistent definitions", plan.ip, h.IP))
			}
			plan.ip = h.IP
		case r.Hostname != "" && h.Hostname == r.Hostname:
			return plan, conflict(ConflictHostnameReserved, h.IP, h.MAC)
		}
	}
	if plan.ip.IsValid() && r.IP.IsValid() && r.IP != plan.ip {
		return plan, conflict(ConflictMACReserved, plan.ip, r.MAC)
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
				return conflict(ConflictIPReserved, r.IP, h.MAC)
			}
		}
		for _, l := range leases {
			if l.IP == r.IP && l.current(now) && !netalloc.SameMAC(l.MAC, r.MAC) {
				err := &AddressConflictError{Network: network, MAC: r.MAC, IP: r.IP, Reason: ConflictLeased, HeldBy: l.MAC, Until: l.Expiry}
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
		if !l.current(now) {
			continue
		}
		if netalloc.SameMAC(l.MAC, r.MAC) {
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

func hasMAC(hosts []Reservation, mac string) bool {
	_, ok := findMAC(hosts, mac)
	return ok
}

func findMAC(hosts []Reservation, mac string) (Reservation, bool) {
	for _, h := range hosts {
		if netalloc.SameMAC(h.MAC, mac) {
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

// normalizeMAC returns mac in libvirt's canonical lower-case form.
func normalizeMAC(mac string) (string, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("invalid MAC address %q", mac)
	}
	return hw.String(), nil
}

// isLocalURI tells whether uri reaches libvirtd on this machine, where the
// host's own addresses and routes can be read through netlink. For a remote
// host they cannot (libvirt's interface driver reports no addresses), and
// libvirt's start-time check is the only guard left.
func isLocalURI(uri string) bool {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return false
	}
	if strings.Contains(scheme, "+") && !strings.HasSuffix(scheme, "+unix") {
		return false
	}
	host, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = host[i+1:]
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return host == "" || host == "localhost" || host == "127.0.0.1" || host == "[::1]" || host == "::1"
}
