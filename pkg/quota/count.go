// Package quota counts what each namespace holds on the libvirt hosts and
// admits new machines and clusters within the operator's namespace totals
// (tenancy.Policy.Namespace).
//
// What a namespace holds is read from libvirt, not from the API server: a
// VM whose LibvirtMachine is gone (orphaned through clusterctl's
// delete-for-move marker, or by a manager that lost track of it) still
// takes its vCPUs, memory and disk on the host, so it still counts. The
// objects in the API server add what they ask for and do not hold yet.
package quota

import (
	"strings"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const gib = 1 << 30

// Holdings is what one namespace has on the libvirt hosts.
type Holdings struct {
	// Usage sums the namespace's domains, clusters and disk.
	tenancy.Usage
	// Domains and Networks are the names of the namespace's domains and
	// networks, so that objects in the API server that already hold
	// theirs are not counted again.
	Domains, Networks map[string]bool
}

// Hold sums the objects of namespace among objs (the owned objects of one
// or more hosts), leaving out of the sums those for which skip is true
// (the object being admitted: its own domain, network and volumes are
// what it asks for, not what it holds besides); their names are kept, so
// that an ask can tell what its object holds already.
//
// Imported base images belong to no one object: each counts, at what it
// occupies, for every namespace with a root disk backed by it (uses).
func Hold(namespace string, objs []virt.OwnedObject, uses []virt.ImageUse, skip func(virt.OwnedObject) bool) Holdings {
	h := Holdings{Domains: map[string]bool{}, Networks: map[string]bool{}}
	clusters := map[string]bool{}
	var diskBytes uint64
	for _, o := range objs {
		if skip != nil && skip(o) {
			h.record(o)
			continue
		}
		switch o.Kind {
		case virt.OwnedDomain:
			if o.Owner == nil || o.Owner.Namespace != namespace {
				continue
			}
			h.Domains[o.Name] = true
			h.VCPUs += o.VCPUs
			h.MemoryMiB += o.MemoryMiB
			h.HostDevices += o.HostDevices
			switch o.Owner.Kind {
			case "LibvirtMachine":
				h.Machines++
			case "LibvirtCluster":
				clusters[o.Owner.Name] = true
			}
		case virt.OwnedNetwork:
			if o.Owner == nil || o.Owner.Namespace != namespace {
				continue
			}
			h.Networks[o.Name] = true
			clusters[o.Owner.Name] = true
		case virt.OwnedVolume:
			if ns, ok := naming.NameNamespace(o.Name); !ok || ns != namespace {
				continue
			}
			diskBytes += volumeBytes(o)
		}
	}
	for _, u := range uses {
		if usedBy(namespace, u) {
			diskBytes += u.Volume.AllocationBytes
		}
	}
	h.Clusters = len(clusters)
	h.DiskGiB = int64((diskBytes + gib - 1) / gib)
	return h
}

// usedBy tells whether a root disk of namespace is backed by the image.
func usedBy(namespace string, u virt.ImageUse) bool {
	for _, v := range u.Users {
		if ns, ok := naming.NameNamespace(v.Name); ok && ns == namespace {
			return true
		}
	}
	return false
}

// record keeps the name of a domain or network of the namespace's.
func (h Holdings) record(o virt.OwnedObject) {
	switch o.Kind {
	case virt.OwnedDomain:
		h.Domains[o.Name] = true
	case virt.OwnedNetwork:
		h.Networks[o.Name] = true
	}
}

// volumeBytes is what a volume takes from the host: a root or data disk
// its whole virtual size (it grows to it as the guest writes), any other
// volume what it occupies.
func volumeBytes(o virt.OwnedObject) uint64 {
	if strings.HasSuffix(o.Name, naming.OverlayVolumeName("")) || naming.IsDataDiskVolumeName(o.Name) {
		return max(o.CapacityBytes, o.AllocationBytes)
	}
	return o.AllocationBytes
}

// MachineAsk is what a LibvirtMachine asks for that h does not show it
// holding yet: nothing once its domain exists.
func MachineAsk(lm *infrav1.LibvirtMachine, h Holdings) tenancy.Usage {
	if h.Domains[naming.DomainName(lm.Namespace, lm.Name)] {
		return tenancy.Usage{}
	}
	return tenancy.MachineUsage(&lm.Spec)
}

// ClusterAsk is what a LibvirtCluster asks for that h does not show it
// holding yet: the cluster itself (its network) and its HAProxy VM.
func ClusterAsk(lc *infrav1.LibvirtCluster, h Holdings) tenancy.Usage {
	var u tenancy.Usage
	if !h.Networks[naming.ClusterNetworkName(lc.Namespace, lc.Name)] && !h.Domains[naming.LoadBalancerDomainName(lc.Namespace, lc.Name)] {
		u.Clusters = 1
	}
	if !h.Domains[naming.LoadBalancerDomainName(lc.Namespace, lc.Name)] {
		u = u.Add(tenancy.LoadBalancerUsage(&lc.Spec))
	}
	return u
}

// OfDomain tells whether o is the domain called domain or one of its
// volumes (root disk, data disks, seed, console log and its rotated files).
func OfDomain(domain string, o virt.OwnedObject) bool {
	switch o.Kind {
	case virt.OwnedDomain:
		return o.Name == domain
	case virt.OwnedVolume:
		return o.Name == naming.OverlayVolumeName(domain) || o.Name == naming.SeedVolumeName(domain) ||
			strings.HasPrefix(o.Name, naming.ConsoleLogVolumeName(domain)) || naming.IsDataDiskVolumeOf(domain, o.Name)
	}
	return false
}
