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
	// VCPUs and MemoryMiB are a domain's; CapacityBytes and
	// AllocationBytes a volume's. Quotas count them: what exists on a host
	// is what a namespace holds, whatever the API server says.
	VCPUs     int64
	MemoryMiB int64
	// HostDevices counts the PCI devices a domain passes through.
	HostDevices     int
	CapacityBytes   uint64
	AllocationBytes uint64
}

// ListOwned lists every domain and network whose <metadata> carries our
// owner element, and every volume in an active pool whose name starts with
// NamePrefix or TestNamePrefix. A controller compares the owners with the
// Kubernetes objects that still exist to find orphans. Objects that vanish
// while being listed are skipped.
func (c *Client) ListOwned(ctx context.Context) ([]OwnedObject, error) {
	var out []OwnedObject
	err := c.withConn(ctx, "ListOwned", func(conn *libvirt.Connect) error {
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

// collect applies owned to each listed object until the first error and
// frees every object, also those after an error.
func collect[T any](objs []T, free func(*T) error, owned func(*T) ([]OwnedObject, error)) ([]OwnedObject, error) {
	var out []OwnedObject
	var firstErr error
	for i := range objs {
		if firstErr == nil {
			got, err := owned(&objs[i])
			switch {
			case IsNotFound(err): // vanished while listing
			case err != nil:
				firstErr = err
			default:
				out = append(out, got...)
			}
		}
		_ = free(&objs[i])
	}
	return out, firstErr
}

func ownedDomains(conn *libvirt.Connect) ([]OwnedObject, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	return collect(doms, (*libvirt.Domain).Free, func(d *libvirt.Domain) ([]OwnedObject, error) {
		name, err := d.GetName()
		if err != nil {
			return nil, err
		}
		o, err := domainOwner(d)
		if err != nil || o == nil {
			return nil, err
		}
		info, err := d.GetInfo()
		if err != nil {
			return nil, err
		}
		dx, err := decodeXML[libvirtxml.Domain](d.GetXMLDesc(0))
		if err != nil {
			return nil, err
		}
		return []OwnedObject{{Kind: OwnedDomain, Name: name, Owner: o, VCPUs: int64(info.NrVirtCpu), MemoryMiB: int64(info.MaxMem / 1024),
			HostDevices: pciHostdevs(dx)}}, nil
	})
}

// ownedNetworks reads the owner from the network XML: libvirt 9.0 stores
// network <metadata> but has no virNetworkGetMetadata (added in 9.7).
func ownedNetworks(conn *libvirt.Connect) ([]OwnedObject, error) {
	nets, err := conn.ListAllNetworks(0)
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	return collect(nets, (*libvirt.Network).Free, func(n *libvirt.Network) ([]OwnedObject, error) {
		o, name, err := networkOwner(n)
		if err != nil || o == nil {
			return nil, err
		}
		return []OwnedObject{{Kind: OwnedNetwork, Name: name, Owner: o}}, nil
	})
}

func networkOwner(n *libvirt.Network) (*Owner, string, error) {
	nx, err := decodeXML[libvirtxml.Network](n.GetXMLDesc(0))
	if err != nil {
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
	return collect(pools, (*libvirt.StoragePool).Free, prefixedVolumes)
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
		if !strings.HasPrefix(n, NamePrefix) && !strings.HasPrefix(n, TestNamePrefix) {
			continue
		}
		obj := OwnedObject{Kind: OwnedVolume, Name: n, Pool: pool}
		err := withVolume(p, n, func(v *libvirt.StorageVol) error {
			info, err := v.GetInfo()
			if err == nil {
				obj.CapacityBytes, obj.AllocationBytes = info.Capacity, info.Allocation
			}
			return err
		})
		switch {
		case IsNotFound(err): // deleted while listing
		case err != nil:
			return nil, fmt.Errorf("reading volume %s/%s: %w", pool, n, err)
		default:
			out = append(out, obj)
		}
	}
	return out, nil
}
