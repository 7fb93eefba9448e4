package virt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// Reservation is a DHCP host entry: MAC always gets IP.
type Reservation struct {
	MAC netalloc.MAC
	// IP is the pinned address; zero asks ReserveAddress to pick the next
	// one that is neither reserved nor leased.
	IP netip.Addr
	// Hostname, optional, is also published in the network's DNS; libvirt
	// requires it to be unique in the network.
	Hostname string
	// Owner, when set, is the object the entry is made for: the entry is
	// named after it (ReservationName, as Hostname), so that it says
	// whose it is. An entry of another owner is never shared with it,
	// and ReleaseOwnedAddress leaves it alone.
	Owner *Owner
}

// ReservationName is the host-entry name that records o as the owner of a
// DHCP host entry: host entries carry no metadata, and this name is
// unique per object (kind, namespace and name hashed into one DNS label,
// as libvirt wants a name starting with a letter).
func ReservationName(o Owner) string {
	sum := sha256.Sum256([]byte(o.Kind + "/" + o.Namespace + "/" + o.Name))
	return reservationNamePrefix + hex.EncodeToString(sum[:12])
}

// reservationNamePrefix starts every ReservationName.
const reservationNamePrefix = "capl-r-"

// networkViews are a network's two definitions and its leases: host
// entries live in both, and they can differ (an entry added to a stopped
// network exists only in the persistent one until it starts).
type networkViews struct {
	facts  networkFacts   // persistent definition, else live
	live   *[]Reservation // nil when the network is not active
	config *[]Reservation // nil when the network is transient
	leases []dhcpLease
	active bool
}

// readViews reads what ReserveAddress and friends need about a network.
func readViews(net *libvirt.Network, name string, withLeases bool) (networkViews, error) {
	var v networkViews
	active, err := net.IsActive()
	if err != nil {
		return v, err
	}
	persistent, err := net.IsPersistent()
	if err != nil {
		return v, err
	}
	v.active = active
	if persistent {
		if v.facts, err = networkDefinition(net); err != nil {
			return v, err
		}
		hosts := v.facts.hosts
		v.config = &hosts
	}
	if active {
		live, err := networkXMLFacts(net, 0)
		if err != nil {
			return v, err
		}
		if !persistent {
			v.facts = live
		}
		v.live = &live.hosts
		if withLeases {
			if v.leases, err = networkLeases(net); err != nil {
				return v, err
			}
		}
	}
	if !v.facts.dhcp || !v.facts.subnet.IsValid() {
		return v, fmt.Errorf("network %s: %w", name, ErrNoDHCP)
	}
	return v, nil
}

// updateFlags selects the definitions a host-entry update applies to.
func updateFlags(live, config bool) libvirt.NetworkUpdateFlags {
	var f libvirt.NetworkUpdateFlags
	if live {
		f |= libvirt.NETWORK_UPDATE_AFFECT_LIVE
	}
	if config {
		f |= libvirt.NETWORK_UPDATE_AFFECT_CONFIG
	}
	return f
}

// ReserveAddress adds the host entry for r (see NetworkHost). The entry
// goes into the live network, so dnsmasq honours it at once, and into the
// persistent definition, so it survives a network restart. Reservations
// on one network are serialised within this client; across processes
// libvirt itself rejects a second entry for the same IP, MAC or name.
//
// With r.Owner set, an entry that already holds r's MAC is used only when
// it is r.Owner's (its name says so), or it is unnamed (made before entries
// were named) and a domain of r.Owner's uses that MAC; otherwise the MAC is
// someone else's (ConflictMACOwned), whatever the caller recorded.
func (c *Client) ReserveAddress(ctx context.Context, network string, r Reservation) (netip.Addr, error) {
	mac, err := netalloc.ParseMAC(r.MAC.String())
	if err != nil {
		return netip.Addr{}, err
	}
	r.MAC = mac
	if r.Owner != nil {
		r.Hostname = ReservationName(*r.Owner)
	}
	unlock, err := c.lockPool(ctx, networksLockKey+network)
	if err != nil {
		return netip.Addr{}, err
	}
	defer unlock()
	var ip netip.Addr
	err = c.withNetwork(ctx, "ReserveAddress", network, func(conn *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, true)
		if err != nil {
			return err
		}
		if err := checkEntryOwner(conn, network, mergeReservations(deref(v.live), deref(v.config)), r); err != nil {
			return err
		}
		plan, err := planReservation(network, v.facts.subnet, v.live, v.config, v.leases, r, time.Now())
		if err != nil {
			return err
		}
		ip = plan.ip
		if !plan.addLive && !plan.addConfig {
			return nil
		}
		doc, err := hostEntryXML(r.MAC, plan.ip, r.Hostname)
		if err != nil {
			return err
		}
		err = net.Update(libvirt.NETWORK_UPDATE_COMMAND_ADD_LAST, libvirt.NETWORK_SECTION_IP_DHCP_HOST,
			v.facts.ipIndex, doc, updateFlags(plan.addLive, plan.addConfig))
		if err != nil {
			return fmt.Errorf("reserving %s for %s on network %s: %w", plan.ip, r.MAC, network, err)
		}
		return nil
	})
	return ip, err
}

// ReleaseAddress removes mac's host entry from the live and persistent
// definitions. The guest's lease outlives it: dnsmasq drops it when the
// guest releases it (a graceful shutdown does, through dhclient) or when it
// expires, at most reservationLease later. Until then ReserveAddress
// refuses that IP to another MAC (ConflictLeased, with the expiry) and
// never picks it by itself.
func (c *Client) ReleaseAddress(ctx context.Context, network string, mac netalloc.MAC) error {
	return c.releaseAddress(ctx, network, mac, nil)
}

// releaseAddress removes mac's host entry when mine (nil: always) says
// it may.
func (c *Client) releaseAddress(ctx context.Context, network string, mac netalloc.MAC, mine func(*libvirt.Connect, Reservation) (bool, error)) error {
	mac = mac.Canonical()
	unlock, err := c.lockPool(ctx, networksLockKey+network)
	if err != nil {
		return err
	}
	defer unlock()
	err = c.withNetwork(ctx, "ReleaseAddress", network, func(conn *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, false)
		if errors.Is(err, ErrNoDHCP) {
			return nil // nothing can be reserved there
		}
		if err != nil {
			return err
		}
		live, inLive := findMAC(deref(v.live), mac)
		config, inConfig := findMAC(deref(v.config), mac)
		if !inLive && !inConfig {
			return nil
		}
		entry := live
		if !inLive {
			entry = config
		}
		if mine != nil {
			if ok, err := mine(conn, entry); err != nil || !ok {
				return err
			}
		}
		doc, err := hostDeleteXML(entry.MAC)
		if err != nil {
			return err
		}
		err = net.Update(libvirt.NETWORK_UPDATE_COMMAND_DELETE, libvirt.NETWORK_SECTION_IP_DHCP_HOST,
			v.facts.ipIndex, doc, updateFlags(inLive, inConfig))
		if err != nil {
			return fmt.Errorf("releasing %s on network %s: %w", mac, network, err)
		}
		return nil
	})
	return ignoreNotFound(err)
}

// checkEntryOwner refuses to hand r an existing entry of its MAC that is
// not r.Owner's; see ReserveAddress.
func checkEntryOwner(conn *libvirt.Connect, network string, entries []Reservation, r Reservation) error {
	h, ok := findMAC(entries, r.MAC)
	if r.Owner == nil || !ok || h.Hostname == r.Hostname {
		return nil
	}
	conflict := &AddressConflictError{Network: network, MAC: r.MAC, IP: h.IP, Reason: ConflictMACOwned, HeldBy: "another object's entry"}
	if h.Hostname != "" {
		return conflict
	}
	users, err := macUsers(conn, r.MAC)
	if err != nil {
		return err
	}
	for _, u := range users {
		if u.IsObject(*r.Owner) {
			return nil // an entry made before entries were named, and its domain is r.Owner's
		}
	}
	conflict.HeldBy = "an entry no domain of this object uses"
	return conflict
}

// macUsers are the owners of the domains with a NIC of mac (nil for a
// domain that is not ours).
func macUsers(conn *libvirt.Connect, mac netalloc.MAC) ([]*Owner, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	var users []*Owner
	var firstErr error
	for i := range doms {
		d := &doms[i]
		if firstErr == nil {
			uses, o, err := domainUsesMAC(d, mac)
			switch {
			case IsNotFound(err):
			case err != nil:
				firstErr = err
			case uses:
				users = append(users, o)
			}
		}
		_ = d.Free()
	}
	return users, firstErr
}

// domainUsesMAC tells whether d has a NIC of mac, and d's owner.
func domainUsesMAC(d *libvirt.Domain, mac netalloc.MAC) (bool, *Owner, error) {
	x, err := decodeXML[libvirtxml.Domain](d.GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE))
	if err != nil || x.Devices == nil {
		return false, nil, err
	}
	for _, iface := range x.Devices.Interfaces {
		if iface.MAC != nil && netalloc.CanonicalMAC(iface.MAC.Address) == mac {
			o, err := domainOwner(d)
			return true, o, err
		}
	}
	return false, nil, nil
}

// ReleaseOwnedAddress removes the host entry of r.MAC only when it is
// r.Owner's: named after it, or unnamed (made before entries were named)
// and used by no domain of another owner. An entry of someone else's is
// left alone: a machine whose recorded MAC is another's (forged, or
// restored from an old backup) must not take that machine's address
// away when it goes.
func (c *Client) ReleaseOwnedAddress(ctx context.Context, network string, r Reservation) error {
	if r.Owner == nil {
		return errors.New("releasing an owned address needs its owner")
	}
	name := ReservationName(*r.Owner)
	return c.releaseAddress(ctx, network, r.MAC, func(conn *libvirt.Connect, h Reservation) (bool, error) {
		if h.Hostname != "" {
			return h.Hostname == name, nil
		}
		users, err := macUsers(conn, h.MAC)
		if err != nil {
			return false, err
		}
		for _, u := range users {
			if u == nil || !u.IsObject(*r.Owner) {
				return false, nil
			}
		}
		return true, nil
	})
}

func deref(s *[]Reservation) []Reservation {
	if s == nil {
		return nil
	}
	return *s
}

// Reservations lists the host entries of both definitions, each MAC once.
func (c *Client) Reservations(ctx context.Context, network string) ([]Reservation, error) {
	var out []Reservation
	err := c.withNetwork(ctx, "Reservations", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, false)
		if err != nil {
			return err
		}
		out = mergeReservations(deref(v.live), deref(v.config))
		return nil
	})
	return out, err
}
