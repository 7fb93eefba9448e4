// Package hostevents turns libvirt host events into reconcile requests for
// LibvirtMachines, so that the controller reacts to a domain stopping or
// crashing, its guest agent connecting or its DHCP lease appearing instead
// of polling for them.
package hostevents

import (
	"context"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
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
		return []string{strings.ToLower(m.Status.Domain.MAC)}
	})
}

// Source subscribes to the host once and feeds a controller-runtime
// channel source. It is a manager Runnable.
type Source struct {
	host   virt.Host
	client client.Client
	filter string
	// leaseTimeout bounds each WatchLease registration.
	leaseTimeout time.Duration

	events chan event.TypedGenericEvent[*infrav1.LibvirtMachine]
	// ctx outlives reconciles (lease watches need that); it ends with Start's.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	watching map[string]time.Time // network/mac → end of its watch
}

// New returns a Source; c should read from the manager's cache, which
// must have MACIndex. Only objects labelled with watchFilter (when set)
// are enqueued.
func New(host virt.Host, c client.Client, watchFilter string) *Source {
	ctx, cancel := context.WithCancel(context.Background())
	return &Source{
		host: host, client: c, filter: watchFilter, leaseTimeout: DefaultLeaseWatchTimeout,
		events: make(chan event.TypedGenericEvent[*infrav1.LibvirtMachine], 1024),
		ctx:    ctx, cancel: cancel, watching: map[string]time.Time{},
	}
}

// Source is the controller-runtime source to pass to WatchesRawSource.
func (s *Source) Source() source.Source {
	return source.Channel(s.events, &handler.TypedEnqueueRequestForObject[*infrav1.LibvirtMachine]{})
}

// Start forwards host events until ctx ends or the host is closed.
func (s *Source) Start(ctx context.Context) error {
	defer s.cancel()
	stop := context.AfterFunc(ctx, s.cancel)
	defer stop()
	for ev := range s.host.Subscribe(ctx) {
		s.dispatch(ctx, ev)
	}
	return nil
}

// dispatch maps one event to the LibvirtMachines it concerns.
func (s *Source) dispatch(ctx context.Context, ev virt.Event) {
	log := ctrl.LoggerFrom(ctx).WithName("hostevents")
	switch ev.Kind {
	case virt.EventReconnected:
		// Events may have been lost while libvirtd was away: resync all.
		s.enqueueList(ctx)
	case virt.EventLease:
		s.mu.Lock()
		delete(s.watching, ev.Network+"/"+strings.ToLower(ev.MAC))
		s.mu.Unlock()
		s.enqueueList(ctx, client.MatchingFields{MACIndex: strings.ToLower(ev.MAC)})
	default:
		if ev.Owner == nil || ev.Owner.Kind != "LibvirtMachine" {
			return
		}
		log.V(4).Info("Domain event", "kind", ev.Kind, "domain", ev.Domain, "detail", ev.Detail)
		s.enqueue(ctx, types.NamespacedName{Namespace: ev.Owner.Namespace, Name: ev.Owner.Name})
	}
}

func (s *Source) enqueueList(ctx context.Context, opts ...client.ListOption) {
	list := &infrav1.LibvirtMachineList{}
	if err := s.client.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing LibvirtMachines for a host event")
		return
	}
	for i := range list.Items {
		s.send(ctx, &list.Items[i])
	}
}

func (s *Source) enqueue(ctx context.Context, key types.NamespacedName) {
	m := &infrav1.LibvirtMachine{}
	if err := s.client.Get(ctx, key, m); err != nil {
		return // gone, or not yet in the cache: its own watch covers it
	}
	s.send(ctx, m)
}

func (s *Source) send(ctx context.Context, m *infrav1.LibvirtMachine) {
	if s.filter != "" && m.Labels[clusterv1.WatchLabel] != s.filter {
		return
	}
	obj := &infrav1.LibvirtMachine{}
	obj.Namespace, obj.Name = m.Namespace, m.Name
	select {
	case s.events <- event.TypedGenericEvent[*infrav1.LibvirtMachine]{Object: obj}:
	case <-ctx.Done():
	}
}

// WatchLease asks the host to publish a lease event for mac on network,
// once per outstanding wait: repeated calls while a watch runs are free.
func (s *Source) WatchLease(network, mac string) {
	key := network + "/" + strings.ToLower(mac)
	s.mu.Lock()
	defer s.mu.Unlock()
	if until, ok := s.watching[key]; ok && time.Now().Before(until) {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.leaseTimeout)
	if err := s.host.WatchLease(ctx, network, mac); err != nil {
		cancel()
		ctrl.Log.WithName("hostevents").Error(err, "Watching for a lease", "network", network, "mac", mac)
		return
	}
	context.AfterFunc(ctx, cancel) // releases the timer once the watch ends
	s.watching[key] = time.Now().Add(s.leaseTimeout)
}
