package loadbalancer

import (
	"context"

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

// Events turns libvirt events of HAProxy VMs (their domains carry the
// LibvirtCluster as owner) into reconcile requests: the VM's guest agent
// connecting is when its configuration can be written, and a VM that
// stops is restarted. It is a manager Runnable.
type Events struct {
	host   virt.Host
	client client.Client
	filter string
	ch     chan event.TypedGenericEvent[*infrav1.LibvirtCluster]
}

// NewEvents returns the event source; c should read from the manager's
// cache. Only LibvirtClusters labelled with watchFilter (when set) are
// enqueued.
func NewEvents(host virt.Host, c client.Client, watchFilter string) *Events {
	return &Events{host: host, client: c, filter: watchFilter,
		ch: make(chan event.TypedGenericEvent[*infrav1.LibvirtCluster], 256)}
}

// Source is the controller-runtime source to pass to WatchesRawSource.
func (e *Events) Source() source.Source {
	return source.Channel(e.ch, &handler.TypedEnqueueRequestForObject[*infrav1.LibvirtCluster]{})
}

// Start forwards host events until ctx ends or the host is closed.
func (e *Events) Start(ctx context.Context) error {
	for ev := range e.host.Subscribe(ctx) {
		switch {
		case ev.Kind == virt.EventReconnected:
			// Events may have been lost while libvirtd was away.
			list := &infrav1.LibvirtClusterList{}
			if err := e.client.List(ctx, list); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Listing LibvirtClusters after a libvirt reconnect")
				continue
			}
			for i := range list.Items {
				e.send(ctx, &list.Items[i])
			}
		case ev.Owner != nil && ev.Owner.Kind == "LibvirtCluster":
			lc := &infrav1.LibvirtCluster{}
			if err := e.client.Get(ctx, types.NamespacedName{Namespace: ev.Owner.Namespace, Name: ev.Owner.Name}, lc); err == nil {
				e.send(ctx, lc)
			}
		}
	}
	return nil
}

func (e *Events) send(ctx context.Context, lc *infrav1.LibvirtCluster) {
	if e.filter != "" && lc.Labels[clusterv1.WatchLabel] != e.filter {
		return
	}
	obj := &infrav1.LibvirtCluster{}
	obj.Namespace, obj.Name = lc.Namespace, lc.Name
	select {
	case e.ch <- event.TypedGenericEvent[*infrav1.LibvirtCluster]{Object: obj}:
	case <-ctx.Done():
	}
}
