package virt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"
)

// Reservation is a DHCP host entry: MAC always gets IP.
type Reservation struct {
	// MAC is compared case-insensitively.
	MAC string
	// IP is the pinned address; zero asks ReserveAddress to pick the next
	// one that is neither reserved nor leased.
	IP netip.Addr
	// Hostname, optional, is also published in the network's DNS; libvirt
	// requires it to be unique in the network.
	Hostname string
}

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
func (c *Client) ReserveAddress(ctx context.Context, network string, r Reservation) (netip.Addr, error) {
	mac, err := normalizeMAC(r.MAC)
	if err != nil {
		return netip.Addr{}, err
	}
	r.MAC = mac
	unlock, err := c.lockPool(ctx, networksLockKey+network)
	if err != nil {
		return netip.Addr{}, err
	}
	defer unlock()
	var ip netip.Addr
	err = c.withNetwork(ctx, "ReserveAddress", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, true)
		if err != nil {
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
func (c *Client) ReleaseAddress(ctx context.Context, network, mac string) error {
	unlock, err := c.lockPool(ctx, networksLockKey+network)
	if err != nil {
		return err
	}
	defer unlock()
	err = c.withNetwork(ctx, "ReleaseAddress", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
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
		entry := live.MAC
		if !inLive {
			entry = config.MAC
		}
		doc, err := hostDeleteXML(entry)
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
