// Package leases is what the engine knows of DHCP leases apart from
// libvirt: a lease and whether it is worth reporting, and the watcher that
// turns polls of a network's leases into one notice per awaited MAC.
//
// Why the engine polls: libvirt has no lease event (its network events are
// only started/stopped/defined/undefined), and the one place that learns
// of a lease at once, dnsmasq's --dhcp-script hook, is libvirt's own
// libvirt_leaseshelper, which runs on the libvirt host and writes a local
// status file; a controller talking qemu+ssh:// to another machine cannot
// hook into either. virNetworkGetDHCPLeases is the remote view of that
// file, so the engine polls it, but only for networks that someone is
// waiting on, with one goroutine per network however many MACs are
// awaited.
package leases

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// Lease is a DHCP lease as the engine uses it.
type Lease struct {
	MAC      netalloc.MAC
	IP       netip.Addr
	Hostname string
	// Expiry is zero for a lease that never expires.
	Expiry time.Time
}

// Current tells whether a lease is worth reporting: unexpired and not
// link-local (a guest's IPv6 link-local address says nothing about where
// to reach it).
func (l Lease) Current(now time.Time) bool {
	if !l.IP.IsValid() || l.IP.IsLinkLocalUnicast() {
		return false
	}
	return l.Expiry.IsZero() || l.Expiry.After(now)
}

// Watcher turns lease polls into notices for the MACs someone waits for.
// It is independent of libvirt (fetch, acquired and start are given), so
// its bookkeeping is unit-tested.
type Watcher struct {
	interval time.Duration
	// fetch reads a network's leases.
	fetch func(ctx context.Context, network string) ([]Lease, error)
	// acquired hands out an awaited MAC's lease without blocking.
	acquired func(network string, l Lease)
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

// NewWatcher returns a watcher that reads a watched network's leases with
// fetch every interval in a loop run by start, and calls acquired once per
// awaited MAC that holds a current lease.
func NewWatcher(interval time.Duration, fetch func(context.Context, string) ([]Lease, error),
	acquired func(network string, l Lease), start func(func(context.Context))) *Watcher {
	return &Watcher{interval: interval, fetch: fetch, acquired: acquired, start: start, nets: map[string]*watchedNetwork{}}
}

// Watch registers interest in mac on network until ctx ends or its lease
// is seen, starting the network's poll loop if none runs. The first poll
// runs at once, so a lease that exists already is reported too.
func (w *Watcher) Watch(ctx context.Context, network string, mac netalloc.MAC) {
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
func (w *Watcher) unwatch(network string, mac netalloc.MAC, id uint64) {
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
func (w *Watcher) run(ctx context.Context, network string) {
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

// poll reads the leases once and reports every awaited MAC that holds a
// current lease. It reports false, having removed the network's entry
// under the lock Watch also takes, once nobody waits any more; a later
// Watch then starts a fresh loop.
func (w *Watcher) poll(ctx context.Context, network string) bool {
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

func (w *Watcher) waiting(network string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nets[network]
	return n != nil && len(n.waiters) > 0
}

// deliver reports the leases of awaited MACs and releases their waiters.
func (w *Watcher) deliver(network string, leases []Lease, now time.Time) {
	var found []Lease
	w.mu.Lock()
	if n := w.nets[network]; n != nil {
		for _, l := range leases {
			if !l.Current(now) || n.waiters[l.MAC] == nil {
				continue
			}
			for _, stop := range n.waiters[l.MAC] {
				stop()
			}
			delete(n.waiters, l.MAC)
			found = append(found, l)
		}
	}
	w.mu.Unlock()
	for _, l := range found {
		w.acquired(network, l)
	}
}

func (w *Watcher) dropLocked(network string) {
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
