package hostevents

import (
	"context"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Forwarder turns libvirt host events into reconcile requests for the
// objects of one kind: the object a domain's owner metadata names, and
// every object after a reconnect, when events may have been lost. It is a
// manager Runnable; pass Source to the controller's WatchesRawSource.
type Forwarder[T client.Object] struct {
	host    Events
	client  client.Client
	kind    string
	filter  string
	newObj  func() T
	newList func() client.ObjectList
	events  chan event.TypedGenericEvent[T]
}

// Events is where host events come from: one libvirt host, or all the
// manager's (hosts.Set).
type Events interface {
	Subscribe(ctx context.Context) <-chan virt.Event
}

// NewForwarder returns a Forwarder for objects whose kind is kind in the
// libvirt owner metadata. c should read from the manager's cache; only
// objects labelled with watchFilter (when set) are enqueued.
func NewForwarder[T client.Object](host Events, c client.Client, kind, watchFilter string,
	newObj func() T, newList func() client.ObjectList) *Forwarder[T] {
	return &Forwarder[T]{
		host: host, client: c, kind: kind, filter: watchFilter, newObj: newObj, newList: newList,
		events: make(chan event.TypedGenericEvent[T], 1024),
	}
}

// Source is the controller-runtime source to pass to WatchesRawSource.
func (f *Forwarder[T]) Source() source.Source {
	return source.Channel(f.events, &handler.TypedEnqueueRequestForObject[T]{})
}

// Start forwards host events until ctx ends or the host is closed.
func (f *Forwarder[T]) Start(ctx context.Context) error {
	for ev := range f.host.Subscribe(ctx) {
		f.Forward(ctx, ev)
	}
	return nil
}

// Forward enqueues what ev concerns among the Forwarder's objects.
func (f *Forwarder[T]) Forward(ctx context.Context, ev virt.Event) {
	switch {
	case ev.Kind == virt.EventReconnected, ev.Kind == virt.EventDisconnected:
		// Events may have been lost, or a host went away: every object
		// looks again (those on a host that is gone say so).
		f.EnqueueList(ctx)
	case ev.Owner != nil && ev.Owner.Kind == f.kind:
		ctrl.LoggerFrom(ctx).V(4).Info("Domain event", "kind", ev.Kind, "domain", ev.Domain, "detail", ev.Detail, "owner", f.kind)
		obj := f.newObj()
		if err := f.client.Get(ctx, types.NamespacedName{Namespace: ev.Owner.Namespace, Name: ev.Owner.Name}, obj); err != nil {
			return // gone, or not yet in the cache: its own watch covers it
		}
		f.send(ctx, obj)
	}
}

// EnqueueList enqueues the objects listed with opts.
func (f *Forwarder[T]) EnqueueList(ctx context.Context, opts ...client.ListOption) {
	list := f.newList()
	if err := f.client.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing objects for a host event", "kind", f.kind)
		return
	}
	objs, err := apimeta.ExtractList(list)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Reading the list for a host event", "kind", f.kind)
		return
	}
	for _, o := range objs {
		if obj, ok := o.(T); ok {
			f.send(ctx, obj)
		}
	}
}

func (f *Forwarder[T]) send(ctx context.Context, obj T) {
	if f.filter != "" && obj.GetLabels()[clusterv1.WatchLabel] != f.filter {
		return
	}
	select {
	case f.events <- event.TypedGenericEvent[T]{Object: obj}:
	case <-ctx.Done():
	}
}
