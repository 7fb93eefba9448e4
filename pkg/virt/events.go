package virt

import (
	"context"
	"strings"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// EventKind says what happened.
type EventKind string

// Event kinds. Domain events come from libvirt's lifecycle and agent
// callbacks; lease events from the network lease watcher.
const (
	// EventDomainDefined: a domain was defined or its definition updated.
	EventDomainDefined EventKind = "DomainDefined"
	// EventDomainUndefined: a domain definition was removed.
	EventDomainUndefined EventKind = "DomainUndefined"
	// EventDomainStarted: a domain started running.
	EventDomainStarted EventKind = "DomainStarted"
	// EventDomainShutdown: the guest finished an orderly shutdown; a
	// DomainStopped follows.
	EventDomainShutdown EventKind = "DomainShutdown"
	// EventDomainStopped: a domain is no longer running (Detail says why).
	EventDomainStopped EventKind = "DomainStopped"
	// EventDomainCrashed: the guest crashed or QEMU failed; controllers fail
	// fast on it instead of waiting for an address.
	EventDomainCrashed EventKind = "DomainCrashed"
	// EventDomainPaused: a domain was paused (also on I/O errors such as a
	// full pool, which Detail then says).
	EventDomainPaused EventKind = "DomainPaused"
	// EventDomainResumed: a paused domain runs again.
	EventDomainResumed EventKind = "DomainResumed"
	// EventAgentConnected: the guest agent inside the domain came up, so
	// guest-agent calls can now succeed.
	EventAgentConnected EventKind = "AgentConnected"
	// EventAgentDisconnected: the guest agent went away.
	EventAgentDisconnected EventKind = "AgentDisconnected"
	// EventLease: a DHCP lease appeared, changed or expired (Network, MAC,
	// IP and Detail are set).
	EventLease EventKind = "Lease"
	// EventReconnected: the connection to libvirtd was re-established;
	// events may have been missed, so subscribers should resync.
	EventReconnected EventKind = "Reconnected"
	// EventDisconnected: libvirtd dropped the connection (it stopped, the
	// host went away); the Client reconnects on its own and publishes
	// EventReconnected when it is back.
	EventDisconnected EventKind = "Disconnected"
)

// Event is one notification from the host. Fields that do not apply to the
// kind are empty.
type Event struct {
	Kind   EventKind
	Domain string
	UUID   string
	Owner  *Owner
	// Network, MAC and IP describe lease events.
	Network string
	MAC     netalloc.MAC
	IP      string
	// Detail is libvirt's reason (e.g. "shutdown", "destroyed", "crashed")
	// or a lease's state.
	Detail string
}

// Subscribe returns a channel of host events that is closed when ctx ends
// or the client is closed. Each subscriber has its own bounded buffer; a
// slow subscriber loses events (the broker counts them, fanout.Broker) rather than stalling
// the others, so it should treat events as hints and resync on
// EventReconnected.
func (c *Client) Subscribe(ctx context.Context) <-chan Event {
	ch := c.events.Subscribe()
	go func() {
		select {
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
		c.events.Unsubscribe(ch)
	}()
	return ch
}

// publish hands ev to every subscriber without blocking.
func (c *Client) publish(ev Event) { c.events.Publish(ev) }

// rawDomainEvent is what a libvirt callback can learn without a round
// trip; the owner lookup happens later, off the event loop.
type rawDomainEvent struct {
	kind   EventKind
	name   string
	uuid   string
	detail string
}

// startDomainEvents registers lifecycle and agent callbacks on every
// connection and starts the worker that attaches owners to them. Callbacks
// only enqueue: calling libvirt from inside one would stall the event loop
// that also carries keepalives.
func (c *Client) startDomainEvents() {
	queue := make(chan rawDomainEvent, 1024)
	enqueue := func(ev rawDomainEvent) {
		select {
		case queue <- ev:
		default:
			c.events.Drop()
		}
	}
	// Registration before the first connect cannot fail: the hook only runs
	// on connect, where an error fails Dial.
	_ = c.addConnHook(func(conn *libvirt.Connect) (func(), error) {
		lifeID, err := conn.DomainEventLifecycleRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, ev *libvirt.DomainEventLifecycle) {
			kind, detail := lifecycleKind(ev)
			if kind == "" {
				return
			}
			enqueue(localDomainEvent(d, kind, detail))
		})
		if err != nil {
			return nil, err
		}
		agentID, err := conn.DomainEventAgentLifecycleRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, ev *libvirt.DomainEventAgentLifecycle) {
			kind := EventAgentDisconnected
			if ev.State == libvirt.CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED {
				kind = EventAgentConnected
			}
			enqueue(localDomainEvent(d, kind, ""))
		})
		if err != nil {
			_ = conn.DomainEventDeregister(lifeID)
			return nil, err
		}
		return func() {
			_ = conn.DomainEventDeregister(agentID)
			_ = conn.DomainEventDeregister(lifeID)
		}, nil
	})
	c.background(func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case raw := <-queue:
				if ev, ok := c.enrichDomainEvent(ctx, raw); ok {
					c.publish(ev)
				}
			}
		}
	})
}

// localDomainEvent reads name and UUID, which the binding holds locally.
func localDomainEvent(d *libvirt.Domain, kind EventKind, detail string) rawDomainEvent {
	name, _ := d.GetName()
	uuid, _ := d.GetUUIDString()
	return rawDomainEvent{kind: kind, name: name, uuid: uuid, detail: detail}
}

// enrichDomainEvent attaches the owner. Events of domains that are not ours
// (no owner metadata, no name prefix) are dropped: other tools share the
// host and their domains are none of the controllers' business.
func (c *Client) enrichDomainEvent(ctx context.Context, raw rawDomainEvent) (Event, bool) {
	ev := Event{Kind: raw.kind, Domain: raw.name, UUID: raw.uuid, Detail: raw.detail}
	if raw.kind == EventDomainUndefined {
		ev.Owner = c.forgetOwner(raw.uuid)
	} else {
		ev.Owner = c.lookupOwner(ctx, raw.uuid)
	}
	ours := ev.Owner != nil || strings.HasPrefix(raw.name, NamePrefix) || strings.HasPrefix(raw.name, TestNamePrefix)
	return ev, ours
}

// lookupOwner returns the owner of the domain with uuid, from cache or
// from its metadata; nil when it has none or is gone.
func (c *Client) lookupOwner(ctx context.Context, uuid string) *Owner {
	c.ownersMu.Lock()
	o, ok := c.owners[uuid]
	c.ownersMu.Unlock()
	if ok {
		return o
	}
	var owner *Owner
	err := c.withConn(ctx, "LookupOwner", func(conn *libvirt.Connect) error {
		dom, err := conn.LookupDomainByUUIDString(uuid)
		if err != nil {
			return err
		}
		defer dom.Free()
		owner, err = domainOwner(dom)
		return err
	})
	if err != nil || owner == nil {
		return nil
	}
	c.rememberOwner(uuid, owner)
	return owner
}

// rememberOwner caches a domain's owner so the undefined event, after
// which the metadata is gone, can still name it.
func (c *Client) rememberOwner(uuid string, o *Owner) {
	if o == nil || uuid == "" {
		return
	}
	c.ownersMu.Lock()
	c.owners[uuid] = o
	c.ownersMu.Unlock()
}

func (c *Client) forgetOwner(uuid string) *Owner {
	c.ownersMu.Lock()
	defer c.ownersMu.Unlock()
	o := c.owners[uuid]
	delete(c.owners, uuid)
	return o
}

// domainOwner reads our metadata element from a domain; (nil, nil) when
// the domain carries none.
func domainOwner(dom *libvirt.Domain) (*Owner, error) {
	md, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, OwnerNamespace, libvirt.DOMAIN_AFFECT_CURRENT)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	o, err := parseOwnerElement(md)
	if IsNotFound(err) {
		return nil, nil
	}
	return o, err
}

// lifecycleKind maps libvirt's lifecycle event to ours; "" for events the
// controllers have no use for.
func lifecycleKind(ev *libvirt.DomainEventLifecycle) (EventKind, string) {
	switch ev.Event {
	case libvirt.DOMAIN_EVENT_DEFINED:
		return EventDomainDefined, ""
	case libvirt.DOMAIN_EVENT_UNDEFINED:
		return EventDomainUndefined, ""
	case libvirt.DOMAIN_EVENT_STARTED:
		return EventDomainStarted, ""
	case libvirt.DOMAIN_EVENT_SUSPENDED:
		if libvirt.DomainEventSuspendedDetailType(ev.Detail) == libvirt.DOMAIN_EVENT_SUSPENDED_IOERROR {
			return EventDomainPaused, "ioerror"
		}
		return EventDomainPaused, ""
	case libvirt.DOMAIN_EVENT_RESUMED:
		return EventDomainResumed, ""
	case libvirt.DOMAIN_EVENT_SHUTDOWN:
		return EventDomainShutdown, ""
	case libvirt.DOMAIN_EVENT_CRASHED:
		return EventDomainCrashed, "guest-panic"
	case libvirt.DOMAIN_EVENT_STOPPED:
		switch libvirt.DomainEventStoppedDetailType(ev.Detail) {
		case libvirt.DOMAIN_EVENT_STOPPED_CRASHED:
			return EventDomainCrashed, "crashed"
		case libvirt.DOMAIN_EVENT_STOPPED_FAILED:
			return EventDomainCrashed, "failed"
		case libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN:
			return EventDomainStopped, "shutdown"
		case libvirt.DOMAIN_EVENT_STOPPED_DESTROYED:
			return EventDomainStopped, "destroyed"
		default:
			return EventDomainStopped, ""
		}
	}
	return "", ""
}
