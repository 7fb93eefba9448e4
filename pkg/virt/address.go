package virt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// AddressSource says where an address was learnt.
type AddressSource string

// Address sources.
const (
	// AddressSourceLease: the network's DHCP server leased it to the MAC;
	// the guest has it now (or had it within the lease time).
	AddressSourceLease AddressSource = "lease"
	// AddressSourceReservation: it is reserved for the MAC but no current
	// lease shows the guest using it yet.
	AddressSourceReservation AddressSource = "reservation"
	// AddressSourceAgent: the guest agent reports it on the guest's
	// interface.
	AddressSourceAgent AddressSource = "agent"
)

// Address is one address of a machine.
type Address struct {
	IP     netip.Addr
	Source AddressSource
	// Hostname is what the guest sent with its DHCP request (the image's
	// hostname at first boot) or the reservation's name.
	Hostname string
}

// AddressQuery selects a machine's NIC.
type AddressQuery struct {
	// Domain is the libvirt domain; needed for the guest agent.
	Domain string
	// Network is the libvirt network of the NIC; empty for a host bridge,
	// where only the guest agent knows the addresses.
	Network string
	// MAC is the NIC's address. Required on libvirt networks; on bridges
	// it narrows the agent's interfaces.
	MAC netalloc.MAC
}

// Addresses reports the NIC's addresses: current leases first, then a
// reservation no lease confirms yet (Source tells them apart). Networks
// without libvirt DHCP and host bridges fall back to the guest agent,
// which fails with ErrAgentUnavailable while the guest boots.
func (c *Client) Addresses(ctx context.Context, q AddressQuery) ([]Address, error) {
	if q.Network == "" {
		q.MAC = q.MAC.Canonical()
		return c.agentAddresses(ctx, q)
	}
	mac, err := netalloc.ParseMAC(q.MAC.String())
	if err != nil {
		return nil, err
	}
	q.MAC = mac
	var out []Address
	err = c.withNetwork(ctx, "Addresses", q.Network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, q.Network, true)
		if err != nil {
			return err
		}
		out = networkAddresses(v.leases, mergeReservations(deref(v.live), deref(v.config)), q.MAC, time.Now())
		return nil
	})
	if errors.Is(err, ErrNoDHCP) && q.Domain != "" {
		return c.agentAddresses(ctx, q)
	}
	return out, err
}

// networkAddresses matches leases and reservations to mac.
func networkAddresses(leases []dhcpLease, hosts []Reservation, mac netalloc.MAC, now time.Time) []Address {
	var out []Address
	seen := map[netip.Addr]bool{}
	for _, l := range leases {
		if l.MAC == mac && l.Current(now) && !seen[l.IP] {
			seen[l.IP] = true
			out = append(out, Address{IP: l.IP, Source: AddressSourceLease, Hostname: l.Hostname})
		}
	}
	if h, ok := findMAC(hosts, mac); ok && h.IP.IsValid() && !seen[h.IP] {
		out = append(out, Address{IP: h.IP, Source: AddressSourceReservation, Hostname: h.Hostname})
	}
	return out
}

// agentAddresses asks the guest agent.
func (c *Client) agentAddresses(ctx context.Context, q AddressQuery) ([]Address, error) {
	if q.Domain == "" {
		return nil, errors.New("addresses on a host bridge need the domain, for the guest agent")
	}
	ifaces, err := c.GuestInterfaces(ctx, q.Domain)
	if err != nil {
		return nil, fmt.Errorf("asking the guest agent of %s for addresses: %w", q.Domain, err)
	}
	return agentAddresses(ifaces, q.MAC), nil
}

// agentAddresses keeps the global addresses of the interface with mac (all
// interfaces when mac is empty, except loopback).
func agentAddresses(ifaces []GuestInterface, mac netalloc.MAC) []Address {
	var out []Address
	for _, i := range ifaces {
		if mac != "" && i.MAC != mac {
			continue
		}
		for _, p := range i.Addresses {
			ip := p.Addr()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
				continue
			}
			out = append(out, Address{IP: ip, Source: AddressSourceAgent})
		}
	}
	return out
}
