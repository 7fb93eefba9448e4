package virt

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// Why the engine polls for leases: libvirt has no lease event (its network
// events are only started/stopped/defined/undefined), and the one place
// that learns of a lease at once, dnsmasq's --dhcp-script hook, is
// libvirt's own libvirt_leaseshelper, which runs on the libvirt host and
// writes a local status file; a controller talking qemu+ssh:// to another
// machine cannot hook into either. virNetworkGetDHCPLeases is the remote
// view of that file, so the engine polls it, but only for networks that
// someone is waiting on, with one goroutine per network however many MACs
// are awaited, and turns what it sees into events.

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

// leaseWatcher turns lease polls into events for the MACs someone waits
// for. It is independent of libvirt (fetch, publish and start are
// injected) so its bookkeeping is unit-tested.
type leaseWatcher struct {
	interval time.Duration
	// fetch reads a network's leases.
	fetch func(ctx context.Context, network string) ([]dhcpLease, error)
	// publish hands out an event without blocking.
	publish func(Event)
	// start runs a poll loop in the background; the loop gets a context
	// that ends when the owner shuts down.
	start func(func(ctx context.Context))

	mu     sync.Mutex
	nets   map[string]*watchedNetwork
	nextID uint64
}

// watchedNetwork is the waiting list of one network; it exists exactly as
// long as its poll goroutine runs.
type watchedNetwork struct {
	// waiters maps a MAC to the registrations waiting for it, each with
	// the function that cancels its context hook.
	waiters map[netalloc.MAC]map[uint64]func() bool
}

func newLeaseWatcher(interval time.Duration, fetch func(context.Context, string) ([]dhcpLease, error),
	publish func(Event), start func(func(context.Context))) *leaseWatcher {
	return &leaseWatcher{interval: interval, fetch: fetch, publish: publish, start: start, nets: map[string]*watchedNetwork{}}
}

// watch registers interest in mac on network until ctx ends
// or its lease is seen, starting the network's poll loop if none runs.
func (w *leaseWatcher) watch(ctx context.Context, network string, mac netalloc.MAC) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, running := w.nets[network]
	if !running {
		n = &watchedNetwork{waiters: map[netalloc.MAC]map[uint64]func() bool{}}
		w.nets[network] = n
	}
	if n.waiters[mac] == nil {
		n.waiters[mac] = map[uint64]func() bool{}
	}
	w.nextID++
	id := w.nextID
	// The hook is registered under w.mu: if ctx is already done it runs in
	// its own goroutine and waits for the lock, so it cannot miss the entry.
	n.waiters[mac][id] = context.AfterFunc(ctx, func() { w.unwatch(network, mac, id) })
	if !running {
		w.start(func(ctx context.Context) { w.run(ctx, network) })
	}
}

// unwatch drops one registration; the poll loop notices an empty list on
// its next round and ends.
func (w *leaseWatcher) unwatch(network string, mac netalloc.MAC, id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nets[network]
	if n == nil {
		return
	}
	delete(n.waiters[mac], id)
	if len(n.waiters[mac]) == 0 {
		delete(n.waiters, mac)
	}
}

// run polls one network until nobody waits on it or ctx ends.
func (w *leaseWatcher) run(ctx context.Context, network string) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for w.poll(ctx, network) {
		select {
		case <-ctx.Done():
			w.mu.Lock()
			w.dropLocked(network)
			w.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// poll reads the leases once and publishes one event per awaited MAC that
// holds a current lease. It reports false, having removed the network's
// entry under the lock watch also takes, once nobody waits any more; a
// later watch then starts a fresh loop.
func (w *leaseWatcher) poll(ctx context.Context, network string) bool {
	if w.waiting(network) {
		// A failed read (network restarting, connection re-established) is
		// retried on the next tick; the waiter's context bounds the wait.
		if leases, err := w.fetch(ctx, network); err == nil {
			w.deliver(network, leases, time.Now())
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.nets[network]; n != nil && len(n.waiters) > 0 {
		return true
	}
	w.dropLocked(network)
	return false
}

func (w *leaseWatcher) waiting(network string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nets[network]
	return n != nil && len(n.waiters) > 0
}

// deliver publishes the leases of awaited MACs and releases their waiters.
func (w *leaseWatcher) deliver(network string, leases []dhcpLease, now time.Time) {
	var events []Event
	w.mu.Lock()
	if n := w.nets[network]; n != nil {
		for _, l := range leases {
			mac := l.MAC
			if !l.current(now) || n.waiters[mac] == nil {
				continue
			}
			for _, stop := range n.waiters[mac] {
				stop()
			}
			delete(n.waiters, mac)
			events = append(events, Event{Kind: EventLease, Network: network, MAC: mac, IP: l.IP.String(), Detail: LeaseAcquired})
		}
	}
	w.mu.Unlock()
	for _, ev := range events {
		w.publish(ev)
	}
}

func (w *leaseWatcher) dropLocked(network string) {
	n := w.nets[network]
	if n == nil {
		return
	}
	for _, ids := range n.waiters {
		for _, stop := range ids {
			stop()
		}
	}
	delete(w.nets, network)
}

// leaseWatcher returns the client's watcher, creating it on first use.
func (c *Client) leaseWatcher() *leaseWatcher {
	c.leasesOnce.Do(func() {
		fetch := func(ctx context.Context, network string) ([]dhcpLease, error) {
			var leases []dhcpLease
			err := c.withNetwork(ctx, "PollLeases", network, func(_ *libvirt.Connect, net *libvirt.Network) (err error) {
				leases, err = networkLeases(net)
				return err
			})
			return leases, err
		}
		c.leases = newLeaseWatcher(leasePollInterval, fetch, c.publish, c.background)
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
	c.leaseWatcher().watch(ctx, network, mac)
	return nil
}
