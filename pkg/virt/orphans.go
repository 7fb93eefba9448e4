package virt

import (
	"context"
	"fmt"
	"strings"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// OwnedKind is the kind of libvirt object ListOwned reports.
type OwnedKind string

// Kinds of owned objects.
const (
	OwnedDomain  OwnedKind = "domain"
	OwnedNetwork OwnedKind = "network"
	OwnedVolume  OwnedKind = "volume"
)

// OwnedObject is a libvirt object that belongs to the provider.
type OwnedObject struct {
	Kind OwnedKind
	Name string
	// Pool is set for volumes.
	Pool string
	// Owner is nil for volumes, which carry no metadata: their owner follows
	// from the name the caller gave them.
	Owner *Owner
}

// ListOwned lists every domain and network whose <metadata> carries our
// owner element, and every volume in an active pool whose name starts with
// NamePrefix or TestNamePrefix. A controller compares the owners with the
// Kubernetes objects that still exist to find orphans. Objects that vanish
// while being listed are skipped.
func (c *Client) ListOwned(ctx context.Context) ([]OwnedObject, error) {
	var out []OwnedObject
	err := c.withConn(ctx, func(conn *libvirt.Connect) error {
		out = nil
		for _, list := range []func(*libvirt.Connect) ([]OwnedObject, error){ownedDomains, ownedNetworks, ownedVolumes} {
			objs, err := list(conn)
			if err != nil {
				return err
			}
			out = append(out, objs...)
		}
		return nil
	})
	return out, err
}

func ownedDomains(conn *libvirt.Connect) ([]OwnedObject, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	var out []OwnedObject
	var firstErr error
	for i := range doms {
		d := &doms[i]
		if firstErr == nil {
			name, err := d.GetName()
			var o *Owner
			if err == nil {
				o, err = domainOwner(d)
			}
			switch {
			case IsNotFound(err):
			case err != nil:
				firstErr = err
			case o != nil:
				out = append(out, OwnedObject{Kind: OwnedDomain, Name: name, Owner: o})
			}
		}
		_ = d.Free()
	}
	return out, firstErr
}

// ownedNetworks reads the owner from the network XML: libvirt 9.0 stores
// network <metadata> but has no virNetworkGetMetadata (added in 9.7).
func ownedNetworks(conn *libvirt.Connect) ([]OwnedObject, error) {
	nets, err := conn.ListAllNetworks(0)
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	var out []OwnedObject
	var firstErr error
	for i := range nets {
		n := &nets[i]
		if firstErr == nil {
			o, name, err := networkOwner(n)
			switch {
			case IsNotFound(err):
			case err != nil:
				firstErr = err
			case o != nil:
				out = append(out, OwnedObject{Kind: OwnedNetwork, Name: name, Owner: o})
			}
		}
		_ = n.Free()
	}
	return out, firstErr
}

func networkOwner(n *libvirt.Network) (*Owner, string, error) {
	doc, err := n.GetXMLDesc(libvirt.NETWORK_XML_INACTIVE)
	if err != nil {
		return nil, "", err
	}
	var nx libvirtxml.Network
	if err := nx.Unmarshal(doc); err != nil {
		return nil, "", err
	}
	if nx.Metadata == nil {
		return nil, nx.Name, nil
	}
	o, err := ParseOwner(nx.Metadata.XML)
	if IsNotFound(err) {
		return nil, nx.Name, nil
	}
	return o, nx.Name, err
}

func ownedVolumes(conn *libvirt.Connect) ([]OwnedObject, error) {
	pools, err := conn.ListAllStoragePools(libvirt.CONNECT_LIST_STORAGE_POOLS_ACTIVE)
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	var out []OwnedObject
	var firstErr error
	for i := range pools {
		p := &pools[i]
		if firstErr == nil {
			objs, err := prefixedVolumes(p)
			if err != nil && !IsNotFound(err) {
				firstErr = err
			}
			out = append(out, objs...)
		}
		_ = p.Free()
	}
	return out, firstErr
}

func prefixedVolumes(p *libvirt.StoragePool) ([]OwnedObject, error) {
	pool, err := p.GetName()
	if err != nil {
		return nil, err
	}
	names, err := p.ListStorageVolumes()
	if err != nil {
		return nil, fmt.Errorf("listing volumes of %s: %w", pool, err)
	}
	var out []OwnedObject
	for _, n := range names {
		if strings.HasPrefix(n, NamePrefix) || strings.HasPrefix(n, TestNamePrefix) {
			out = append(out, OwnedObject{Kind: OwnedVolume, Name: n, Pool: pool})
		}
	}
	return out, nil
}
