package virt

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/leases"
)

// AddressRange is a range of a libvirt network's DHCP server, both ends
// included.
type AddressRange struct{ Start, End netip.Addr }

// Contains tells whether a lies in the range.
func (r AddressRange) Contains(a netip.Addr) bool {
	return r.Start.IsValid() && r.End.IsValid() && r.Start.Compare(a) <= 0 && a.Compare(r.End) <= 0
}

// SegmentUse is who holds which address and MAC on one segment of one
// host (a libvirt network or a host bridge), as libvirt knows it: what a
// VM's address or MAC must not collide with.
type SegmentUse struct {
	// Own are the host's own addresses on the segment: a libvirt
	// network's <ip> addresses (its gateway), or a host bridge's
	// addresses (read through netlink when the host is this machine,
	// else the address a remote URI names).
	Own []netip.Addr
	// DHCPRanges are a libvirt network's DHCP ranges.
	DHCPRanges []AddressRange
	// Reservations are a libvirt network's DHCP host entries, of both
	// definitions; Leases its DHCP server's leases.
	Reservations []Reservation
	Leases       []leases.Lease
	// Domains are the host's domains, of any owner, with a NIC on the
	// segment.
	Domains []SegmentDomain
}

// SegmentDomain is a domain with a NIC on a segment.
type SegmentDomain struct {
	Name string
	// Owner is nil for a domain that is not ours.
	Owner *Owner
	// MACs are its NICs' MACs on the segment.
	MACs []netalloc.MAC
	// Addresses are what it holds statically (DomainInfo.StaticAddresses).
	Addresses []netip.Addr
}

// SegmentUse describes the segment of network (a libvirt network, whose
// own bridge counts too) or else of bridge (a host bridge); see
// NetworkHost. IsNotFound(err) when network does not exist.
func (c *Client) SegmentUse(ctx context.Context, network, bridge string) (SegmentUse, error) {
	var use SegmentUse
	err := c.withConn(ctx, "SegmentUse", func(conn *libvirt.Connect) error {
		use = SegmentUse{}
		if network != "" {
			var err error
			if bridge, err = networkSegment(conn, network, &use); err != nil {
				return err
			}
		} else {
			use.Own = c.bridgeAddresses(bridge)
		}
		doms, err := segmentDomains(conn, network, bridge)
		use.Domains = doms
		return err
	})
	return use, err
}

// networkSegment reads a libvirt network's own addresses, DHCP ranges,
// host entries and leases into use, and returns its bridge.
func networkSegment(conn *libvirt.Connect, name string, use *SegmentUse) (string, error) {
	var bridge string
	err := withNetwork(conn, name, func(net *libvirt.Network) error {
		active, err := net.IsActive()
		if err != nil {
			return err
		}
		flags := []libvirt.NetworkXMLFlags{libvirt.NETWORK_XML_INACTIVE}
		if active {
			flags = append(flags, 0)
		}
		seen := map[Reservation]bool{}
		for _, f := range flags {
			x, err := decodeXML[libvirtxml.Network](net.GetXMLDesc(f))
			if err != nil {
				return err
			}
			if x.Bridge != nil && x.Bridge.Name != "" {
				bridge = x.Bridge.Name
			}
			for _, ip := range x.IPs {
				if a, err := netip.ParseAddr(ip.Address); err == nil && !containsAddr(use.Own, a) {
					use.Own = append(use.Own, a)
				}
				if ip.DHCP == nil {
					continue
				}
				for _, r := range ip.DHCP.Ranges {
					start, err1 := netip.ParseAddr(r.Start)
					end, err2 := netip.ParseAddr(r.End)
					if r := (AddressRange{Start: start, End: end}); err1 == nil && err2 == nil && !slices.Contains(use.DHCPRanges, r) {
						use.DHCPRanges = append(use.DHCPRanges, r)
					}
				}
				for _, h := range ip.DHCP.Hosts {
					a, _ := netip.ParseAddr(h.IP)
					e := Reservation{MAC: netalloc.CanonicalMAC(h.MAC), IP: a, Hostname: h.Name}
					if !seen[e] {
						seen[e] = true
						use.Reservations = append(use.Reservations, e)
					}
				}
			}
		}
		if active {
			if use.Leases, err = networkLeases(net); err != nil {
				return err
			}
		}
		return nil
	})
	return bridge, err
}

// withNetwork looks up a network by name and frees it after fn.
func withNetwork(conn *libvirt.Connect, name string, fn func(*libvirt.Network) error) error {
	net, err := conn.LookupNetworkByName(name)
	return use(net, err, "network "+name, fn)
}

// bridgeAddresses are the host's addresses on a host bridge: read through
// netlink when libvirtd runs on this machine; for a remote host only the
// address its URI names, if it names one (libvirt's interface driver
// reports no addresses).
func (c *Client) bridgeAddresses(bridge string) []netip.Addr {
	if isLocalURI(c.uri) {
		addrs, err := netalloc.InterfaceAddresses(bridge)
		if err == nil {
			return addrs
		}
		return nil
	}
	if a, ok := uriAddress(c.uri); ok {
		return []netip.Addr{a}
	}
	return nil
}

// uriAddress is the IP address a URI's host part is, if it is one.
func uriAddress(uri string) (netip.Addr, bool) {
	_, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return netip.Addr{}, false
	}
	host, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = host[i+1:]
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return a, err == nil
}

// segmentDomains lists every domain with a NIC on network or bridge.
func segmentDomains(conn *libvirt.Connect, network, bridge string) ([]SegmentDomain, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	defer func() {
		for i := range doms {
			_ = doms[i].Free()
		}
	}()
	var out []SegmentDomain
	for i := range doms {
		x, err := decodeXML[libvirtxml.Domain](doms[i].GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE))
		if IsNotFound(err) {
			continue // undefined meanwhile
		}
		if err != nil {
			return nil, err
		}
		if sd, ok := onSegment(x, network, bridge); ok {
			out = append(out, sd)
		}
	}
	return out, nil
}

// onSegment describes domain d when a NIC of it is on network or bridge.
func onSegment(d *libvirtxml.Domain, network, bridge string) (SegmentDomain, bool) {
	sd := SegmentDomain{Name: d.Name}
	if d.Devices != nil {
		for _, iface := range d.Devices.Interfaces {
			src := iface.Source
			on := src != nil && ((network != "" && src.Network != nil && src.Network.Network == network) ||
				(bridge != "" && src.Bridge != nil && src.Bridge.Bridge == bridge))
			if on && iface.MAC != nil {
				sd.MACs = append(sd.MACs, netalloc.CanonicalMAC(iface.MAC.Address))
			}
		}
	}
	if len(sd.MACs) == 0 {
		return sd, false
	}
	if d.Metadata != nil {
		if o, err := ParseOwner(d.Metadata.XML); err == nil {
			sd.Owner = o
		}
	}
	sd.Addresses = staticAddressesOf(d)
	return sd, true
}

// staticAddressesOf is what a domain holds statically: the addresses its
// ownership metadata records, else its traffic filter's IP parameters.
func staticAddressesOf(d *libvirtxml.Domain) []netip.Addr {
	if d.Metadata != nil {
		if f, err := parseOwnerFields(d.Metadata.XML); err == nil {
			if addrs := f.recordedAddresses(); len(addrs) > 0 {
				return addrs
			}
		}
	}
	var out []netip.Addr
	if d.Devices == nil {
		return nil
	}
	for _, iface := range d.Devices.Interfaces {
		if iface.FilterRef == nil {
			continue
		}
		for _, p := range iface.FilterRef.Parameters {
			if a, err := netip.ParseAddr(p.Value); p.Name == "IP" && err == nil && !containsAddr(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}
