package virt

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/leases"
)

// Why the engine polls for leases: see package leases.

// leasePollInterval is how often a watched network's leases are read.
// Guests under TCG take a minute to DHCP; 2 s costs nothing and adds little
// to that (minikube uses the same interval).
const leasePollInterval = 2 * time.Second

// LeaseAcquired is the Detail of the EventLease published by WatchLease.
const LeaseAcquired = "acquired"

// networkLeases reads a network's current DHCP leases.
func networkLeases(net *libvirt.Network) ([]dhcpLease, error) {
	raw, err := net.GetDHCPLeases()
	if err != nil {
		return nil, fmt.Errorf("reading DHCP leases: %w", err)
	}
	out := make([]dhcpLease, 0, len(raw))
	for _, l := range raw {
		ip, err := netip.ParseAddr(l.IPaddr)
		if err != nil {
			continue
		}
		lease := dhcpLease{MAC: netalloc.CanonicalMAC(l.Mac), IP: ip, Hostname: l.Hostname}
		// libvirt reports a lease without expiry ("infinite") as 0.
		if l.ExpiryTime.Unix() > 0 {
			lease.Expiry = l.ExpiryTime
		}
		out = append(out, lease)
	}
	return out, nil
}

// leaseWatcher returns the client's watcher, creating it on first use;
// what it finds is published as EventLease.
func (c *Client) leaseWatcher() *leases.Watcher {
	c.leasesOnce.Do(func() {
		fetch := func(ctx context.Context, network string) ([]dhcpLease, error) {
			var found []dhcpLease
			err := c.withNetwork(ctx, "PollLeases", network, func(_ *libvirt.Connect, net *libvirt.Network) (err error) {
				found, err = networkLeases(net)
				return err
			})
			return found, err
		}
		acquired := func(network string, l leases.Lease) {
			c.publish(Event{Kind: EventLease, Network: network, MAC: l.MAC, IP: l.IP.String(), Detail: LeaseAcquired})
		}
		c.leases = leases.NewWatcher(leasePollInterval, fetch, acquired, c.background)
	})
	return c.leases
}

// WatchLease registers interest in mac's lease on network (see
// NetworkHost). The lease may exist already: the first poll runs at once,
// so registering and then waiting for the event cannot race. The network
// must be a libvirt network with DHCP (ErrNoDHCP otherwise: on a host
// bridge, watch the guest agent instead).
func (c *Client) WatchLease(ctx context.Context, network string, mac netalloc.MAC) error {
	mac, err := netalloc.ParseMAC(mac.String())
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err = c.withNetwork(ctx, "WatchLease", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		f, err := networkXMLFacts(net, 0)
		if err != nil {
			return err
		}
		if !f.dhcp {
			return fmt.Errorf("network %s: %w", network, ErrNoDHCP)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.leaseWatcher().Watch(ctx, network, mac)
	return nil
}
