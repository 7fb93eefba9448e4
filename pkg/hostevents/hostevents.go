// Package hostevents turns libvirt host events into reconcile requests, so
// that the controllers react to a domain stopping or crashing, its guest
// agent connecting or (for LibvirtMachines) its DHCP lease appearing
// instead of polling for them: a Forwarder per kind, which the
// LibvirtMachine's Source extends with lease events.
package hostevents

import (
	"context"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// MACIndex indexes LibvirtMachines by status.domain.mac (lower case), so a
// lease event finds its machine.
const MACIndex = "status.domain.mac"

// DefaultLeaseWatchTimeout bounds one lease watch; a reconcile that still
// waits registers again.
const DefaultLeaseWatchTimeout = 15 * time.Minute

// IndexMAC registers MACIndex with the manager's cache.
func IndexMAC(ctx context.Context, indexer client.FieldIndexer) error {
	return indexer.IndexField(ctx, &infrav1.LibvirtMachine{}, MACIndex, func(o client.Object) []string {
		m, ok := o.(*infrav1.LibvirtMachine)
		if !ok || m.Status.Domain == nil || m.Status.Domain.MAC == "" {
			return nil
		}
		return []string{netalloc.CanonicalMAC(m.Status.Domain.MAC).String()}
	})
}

// Source feeds the LibvirtMachine controller: a Forwarder for the machines'
// domains, plus lease events, which name a MAC rather than an owner. It is
// a manager Runnable.
type Source struct {
	*Forwarder[*infrav1.LibvirtMachine]
	// leaseTimeout bounds each WatchLease registration.
	leaseTimeout time.Duration

	// ctx outlives reconciles (lease watches need that); it ends with Start's.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	watching map[leaseKey]time.Time // → end of its watch
}

// leaseKey is one lease watch: a MAC on a network of a host.
type leaseKey struct {
	host    virt.NetworkHost
	network string
	mac     netalloc.MAC
}

// New returns a Source; c should read from the manager's cache, which
// must have MACIndex. Only objects labelled with watchFilter (when set)
// are enqueued.
func New(host Events, c client.Client, watchFilter string) *Source {
	ctx, cancel := context.WithCancel(context.Background())
	return &Source{
		Forwarder: NewForwarder(host, c, "LibvirtMachine", watchFilter,
			func() *infrav1.LibvirtMachine { return &infrav1.LibvirtMachine{} },
			func() client.ObjectList { return &infrav1.LibvirtMachineList{} }),
		leaseTimeout: DefaultLeaseWatchTimeout,
		ctx:          ctx, cancel: cancel, watching: map[leaseKey]time.Time{},
	}
}

// Start forwards host events until ctx ends or the host is closed.
func (s *Source) Start(ctx context.Context) error {
	defer s.cancel()
	stop := context.AfterFunc(ctx, s.cancel)
	defer stop()
	for ev := range s.host.Subscribe(ctx) {
		if ev.Kind != virt.EventLease {
			s.Forward(ctx, ev)
			continue
		}
		s.mu.Lock()
		for k := range s.watching {
			if k.network == ev.Network && k.mac == ev.MAC {
				delete(s.watching, k)
			}
		}
		s.mu.Unlock()
		s.EnqueueList(ctx, client.MatchingFields{MACIndex: ev.MAC.String()})
	}
	return nil
}

// WatchLease asks host to publish a lease event for mac on network,
// once per outstanding wait: repeated calls while a watch runs are free.
func (s *Source) WatchLease(host virt.NetworkHost, network string, mac netalloc.MAC) {
	key := leaseKey{host: host, network: network, mac: mac}
	s.mu.Lock()
	defer s.mu.Unlock()
	if until, ok := s.watching[key]; ok && time.Now().Before(until) {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.leaseTimeout)
	if err := host.WatchLease(ctx, network, mac); err != nil {
		cancel()
		ctrl.Log.WithName("hostevents").Error(err, "Watching for a lease", "network", network, "mac", mac.String())
		return
	}
	context.AfterFunc(ctx, cancel) // releases the timer once the watch ends
	s.watching[key] = time.Now().Add(s.leaseTimeout)
}
