package virt

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

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
func hostEntryXML(mac netalloc.MAC, ip netip.Addr, hostname string) (string, error) {
	h := libvirtxml.NetworkDHCPHost{
		MAC:   mac.String(),
		IP:    ip.String(),
		Name:  hostname,
		Lease: &libvirtxml.NetworkDHCPLease{Expiry: uint(reservationLease / time.Minute), Unit: "minutes"},
	}
	return h.Marshal()
}

// hostDeleteXML renders the <host> element that selects an entry for
// deletion: libvirt matches on every attribute given, so only the MAC is.
func hostDeleteXML(mac netalloc.MAC) (string, error) {
	h := libvirtxml.NetworkDHCPHost{MAC: mac.String()}
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
			f.hosts = append(f.hosts, Reservation{MAC: netalloc.CanonicalMAC(h.MAC), IP: addr, Hostname: h.Name})
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

// listNetworks reads every libvirt network's persistent definition (the
// live one for transient networks), the one that matters at its next start.
func listNetworks(conn *libvirt.Connect) ([]libvirtNetwork, error) {
	nets, err := conn.ListAllNetworks(0)
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	defer func() {
		for i := range nets {
			_ = nets[i].Free()
		}
	}()
	out := make([]libvirtNetwork, 0, len(nets))
	for i := range nets {
		f, err := networkDefinition(&nets[i])
		if IsNotFound(err) {
			continue // undefined meanwhile
		}
		if err != nil {
			return nil, err
		}
		active, err := nets[i].IsActive()
		if IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, libvirtNetwork{facts: f, active: active})
	}
	return out, nil
}

// networkDefinition parses a network's persistent definition, or its live
// one when it is transient.
func networkDefinition(net *libvirt.Network) (networkFacts, error) {
	return networkXMLFacts(net, libvirt.NETWORK_XML_INACTIVE)
}

func networkXMLFacts(net *libvirt.Network, flags libvirt.NetworkXMLFlags) (networkFacts, error) {
	doc, err := net.GetXMLDesc(flags)
	if err != nil {
		return networkFacts{}, err
	}
	return parseNetwork(doc)
}

// info describes a network from its facts.
func (f networkFacts) info(managed bool) NetworkInfo {
	info := NetworkInfo{Name: f.name, Bridge: f.bridge, CIDR: f.subnet, Managed: managed, DHCP: f.dhcp}
	if f.subnet.IsValid() {
		info.Gateway = netalloc.Gateway(f.subnet)
	}
	if managed {
		info.Owner = f.owner
	}
	return info
}
