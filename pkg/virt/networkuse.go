package virt

import (
	"context"
	"fmt"
	"sort"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// UseNetwork describes an existing network without taking it over: it
// must be running, and it is reported as unmanaged even if it carries our
// metadata, so the caller never deletes a network it only refers to.
func (c *Client) UseNetwork(ctx context.Context, name string) (NetworkInfo, error) {
	var info NetworkInfo
	err := c.withNetwork(ctx, "UseNetwork", name, func(_ *libvirt.Connect, net *libvirt.Network) error {
		active, err := net.IsActive()
		if err != nil {
			return err
		}
		if !active {
			return fmt.Errorf("network %s: %w", name, ErrNetworkInactive)
		}
		f, err := networkXMLFacts(net, 0)
		if err != nil {
			return err
		}
		info = f.info(false)
		return nil
	})
	return info, err
}

// UseBridge describes a host bridge. Whether it exists is asked from
// libvirt's interface driver, so this also works for remote hosts; when
// that driver is unavailable the bridge is taken on trust and a missing
// one shows up when the domain starts.
func (c *Client) UseBridge(ctx context.Context, bridge string) (NetworkInfo, error) {
	err := c.withConn(ctx, "UseBridge", func(conn *libvirt.Connect) error {
		iface, err := conn.LookupInterfaceByName(bridge)
		if IsNotFound(err) {
			return fmt.Errorf("host bridge %s: %w", bridge, ErrNotFound)
		}
		if err != nil {
			return nil // no interface driver: see above
		}
		defer iface.Free()
		doc, err := iface.GetXMLDesc(0)
		if err != nil {
			return err
		}
		var x libvirtxml.Interface
		if err := x.Unmarshal(doc); err != nil {
			return fmt.Errorf("parsing interface %s: %w", bridge, err)
		}
		if x.Bridge == nil {
			return fmt.Errorf("host interface %s is not a bridge", bridge)
		}
		return nil
	})
	if err != nil {
		return NetworkInfo{}, err
	}
	return NetworkInfo{Bridge: bridge}, nil
}

// DeleteNetwork removes a network the provider created once no domain,
// running or merely defined, refers to it (a defined domain would fail to
// start later). Not-found is success; a network without our metadata is
// refused with ErrNetworkNotOwned.
func (c *Client) DeleteNetwork(ctx context.Context, name string) error {
	err := c.withNetwork(ctx, "DeleteNetwork", name, func(conn *libvirt.Connect, net *libvirt.Network) error {
		f, err := networkDefinition(net)
		if err != nil {
			return err
		}
		if f.owner == nil {
			return fmt.Errorf("network %s: %w", name, ErrNetworkNotOwned)
		}
		users, err := domainsUsing(conn, name, f.bridge)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return &NetworkInUseError{Network: name, Domains: users}
		}
		active, err := net.IsActive()
		if err != nil {
			return err
		}
		if active {
			if err := net.Destroy(); ignoreNotFound(err) != nil {
				return fmt.Errorf("destroying network %s: %w", name, err)
			}
		}
		if persistent, err := net.IsPersistent(); err != nil || !persistent {
			return ignoreNotFound(err)
		}
		if err := net.Undefine(); ignoreNotFound(err) != nil {
			return fmt.Errorf("undefining network %s: %w", name, err)
		}
		return nil
	})
	return ignoreNotFound(err)
}

// domainsUsing lists the domains whose live or persistent definition has
// an interface on the network or its bridge, sorted by name.
func domainsUsing(conn *libvirt.Connect, name, bridge string) ([]string, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	defer func() {
		for i := range doms {
			_ = doms[i].Free()
		}
	}()
	var users []string
	for i := range doms {
		uses, err := domainUses(&doms[i], name, bridge)
		if IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if uses {
			dn, err := doms[i].GetName()
			if err != nil {
				return nil, err
			}
			users = append(users, dn)
		}
	}
	sort.Strings(users)
	return users, nil
}

// domainUses checks both definitions: a running domain's persistent config
// may differ from its live one after hot-plugging.
func domainUses(dom *libvirt.Domain, name, bridge string) (bool, error) {
	for _, flags := range []libvirt.DomainXMLFlags{0, libvirt.DOMAIN_XML_INACTIVE} {
		doc, err := dom.GetXMLDesc(flags)
		if err != nil {
			return false, err
		}
		if uses, err := interfaceUses(doc, name, bridge); err != nil || uses {
			return uses, err
		}
	}
	return false, nil
}

// withNetwork looks a network up and runs fn on it; a missing network is
// an error that IsNotFound recognises. op names the operation as withConn's.
func (c *Client) withNetwork(ctx context.Context, op, name string, fn func(*libvirt.Connect, *libvirt.Network) error) error {
	return c.withConn(ctx, op, func(conn *libvirt.Connect) error {
		net, err := conn.LookupNetworkByName(name)
		if err != nil {
			if IsNotFound(err) {
				return fmt.Errorf("network %s: %w", name, ErrNotFound)
			}
			return err
		}
		defer net.Free()
		return fn(conn, net)
	})
}
