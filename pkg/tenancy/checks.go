package tenancy

import (
	"maps"
	"slices"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// Part is what of a machine or cluster a Refusal is about. In a
// cluster's refusals the image, sizes and IPAM pool are its HAProxy VM's.
type Part string

// The parts a refusal can be about.
const (
	// PartPool is the storage pool; Field is "name" or "path".
	PartPool Part = "pool"
	// PartDataDiskPool is the pool of data disk Index.
	PartDataDiskPool Part = "dataDiskPool"
	// PartNetwork is the network a VM joins; Field is "name" (a libvirt
	// network) or "bridge" (a host bridge).
	PartNetwork Part = "network"
	// PartNetworkCIDR is the range of the network the provider creates.
	PartNetworkCIDR Part = "networkCIDR"
	// PartImageVolume is the base image's volume; Field is "name" or
	// "pool".
	PartImageVolume Part = "imageVolume"
	// PartImageURL is the base image's URL.
	PartImageURL Part = "imageURL"
	// PartSize is one size of a VM; Field is the spec's field ("cpus",
	// "memoryMiB", "diskSizeGiB").
	PartSize Part = "size"
	// PartIPAMPool is IPAM pool Index the VM's addresses come from.
	PartIPAMPool Part = "ipamPool"
	// PartHostDevice is host device Index of a machine.
	PartHostDevice Part = "hostDevice"
	// PartRecordedPool and PartRecordedNetwork are the placement the
	// provider recorded on the object (annotations).
	PartRecordedPool    Part = "recordedPool"
	PartRecordedNetwork Part = "recordedNetwork"
)

// Refusal is one reference or size the policy refuses.
type Refusal struct {
	Part Part
	// Field is the field within Part at fault, "" when Part is one value.
	Field string
	// Index is the entry of a list Part is one of (data disks, host
	// devices, IPAM pools); 0 otherwise.
	Index int
	// Value is what the object says there, as written.
	Value string
	// Reason is the reason of the condition the controller reports the
	// refusal on (infrav1's ...NotAllowedReason).
	Reason string
	// Message says why, after the field it is about.
	Message string
}

// Pool is a storage pool a VM's volumes go in; Path is set only when the
// provider would create the pool there.
type Pool struct{ Name, Path string }

// Network is the network a VM joins: a libvirt network by name, or a host
// bridge.
type Network struct{ Name, Bridge string }

// Image is the base image a VM's root disk is a copy of.
type Image struct {
	Volume *infrav1.VolumeReference
	// DefaultPool is the pool of a Volume naming none; "" when unknown (a
	// template), which leaves that pool's check to the controller.
	DefaultPool string
	URL         string
}

// Recorded is the placement the provider records on its objects
// (annotations). It is honoured before the spec, so a value written by
// hand is a reference like any other.
type Recorded struct {
	Pool string
	// Network is the network annotation's value as written, NetworkRef
	// what it says.
	Network    string
	NetworkRef Network
}

// MachineRefs is what a machine names and asks for, as far as the caller
// knows it: the webhook has the spec and annotations, the controller where
// the machine's placement resolved to.
type MachineRefs struct {
	// Pool is the pool of the root disk; zero when unknown (the webhook
	// leaves it to the cluster's check and to Recorded).
	Pool Pool
	// DataDiskPools are the data disks' pools, "" for the root disk's.
	DataDiskPools []string
	Network       Network
	AddressPools  []infrav1.IPPoolReference
	Image         Image
	// Usage is what the machine asks for (MachineUsage).
	Usage Usage
	// HostDevices are the aliases of the host devices it takes.
	HostDevices []string
	Recorded    Recorded
}

// MachineRefsOf is what a machine of spec names and asks for, as its spec
// says it; images without a pool are in pool. Where the placement
// resolved to something else (the cluster's pool and network, a recorded
// placement), the caller sets it.
func MachineRefsOf(spec *infrav1.LibvirtMachineSpec, pool string) MachineRefs {
	m := MachineRefs{
		Image: Image{Volume: spec.Image.Volume, DefaultPool: pool, URL: spec.Image.URL},
		Usage: MachineUsage(spec),
	}
	for _, d := range spec.DataDisks {
		m.DataDiskPools = append(m.DataDiskPools, d.Pool)
	}
	for _, d := range spec.HostDevices {
		m.HostDevices = append(m.HostDevices, d.Name)
	}
	if n := spec.Network; n != nil {
		m.Network, m.AddressPools = Network{Name: n.Name, Bridge: n.Bridge}, n.AddressesFromPools
	}
	return m
}

// LoadBalancerRefs is what a cluster's HAProxy VM names and asks for.
type LoadBalancerRefs struct {
	Image Image
	// Usage is what the VM asks for (LoadBalancerUsage).
	Usage       Usage
	AddressPool *infrav1.IPPoolReference
}

// ClusterRefs is what a cluster names, as far as the caller knows it.
type ClusterRefs struct {
	// Pool is the pool spec.storagePool asks for, defaults applied.
	Pool    Pool
	Network infrav1.ClusterNetwork
	// LoadBalancer is the HAProxy VM's; nil for none.
	LoadBalancer *LoadBalancerRefs
	Recorded     Recorded
}

// CheckMachine returns every refusal of what a machine of namespace
// names and asks for, in the order of its fields, so that admission and
// reconcile report the same ones.
func (p Policy) CheckMachine(namespace string, m MachineRefs) []Refusal {
	var out []Refusal
	if m.Pool.Name != "" {
		out = append(out, p.checkPool(m.Pool)...)
	}
	out = append(out, p.checkImage(m.Image)...)
	out = append(out, p.checkSizes(m.Usage)...)
	for i, pool := range m.DataDiskPools {
		if pool == "" {
			continue // the root disk's pool
		}
		if err := p.CheckPoolName(pool); err != nil {
			out = append(out, Refusal{Part: PartDataDiskPool, Index: i, Value: pool, Reason: infrav1.StoragePoolNotAllowedReason, Message: err.Error()})
		}
	}
	for i, alias := range m.HostDevices {
		if _, err := p.HostDevice(alias); err != nil {
			out = append(out, Refusal{Part: PartHostDevice, Index: i, Value: alias, Reason: infrav1.HostDeviceNotAllowedReason, Message: err.Error()})
		}
	}
	out = append(out, p.checkNetwork(namespace, m.Network)...)
	for i, ref := range m.AddressPools {
		if err := p.CheckIPPool(namespace, ref); err != nil {
			out = append(out, Refusal{Part: PartIPAMPool, Index: i, Value: ref.Name, Reason: infrav1.IPPoolNotAllowedReason, Message: err.Error()})
		}
	}
	return append(out, p.checkRecorded(namespace, m.Recorded)...)
}

// CheckCluster returns every refusal of what a cluster of namespace
// names and what its HAProxy VM asks for, in the order of its fields.
func (p Policy) CheckCluster(namespace string, c ClusterRefs) []Refusal {
	out := p.checkPool(c.Pool)
	out = append(out, p.checkNetwork(namespace, Network{Name: c.Network.Name, Bridge: c.Network.Bridge})...)
	if err := p.CheckClusterNetworkCIDR(c.Network); err != nil {
		out = append(out, Refusal{Part: PartNetworkCIDR, Value: c.Network.CIDR, Reason: infrav1.NetworkNotAllowedReason, Message: err.Error()})
	}
	if lb := c.LoadBalancer; lb != nil {
		out = append(out, p.checkImage(lb.Image)...)
		out = append(out, p.checkSizes(lb.Usage)...)
		if ref := lb.AddressPool; ref != nil {
			if err := p.CheckIPPool(namespace, *ref); err != nil {
				out = append(out, Refusal{Part: PartIPAMPool, Value: ref.Name, Reason: infrav1.IPPoolNotAllowedReason, Message: err.Error()})
			}
		}
	}
	return append(out, p.checkRecorded(namespace, c.Recorded)...)
}

func (p Policy) checkPool(pool Pool) []Refusal {
	f, err := p.CheckPool(pool.Name, pool.Path)
	if err == nil {
		return nil
	}
	value := pool.Name
	if f == "path" {
		value = pool.Path
	}
	return []Refusal{{Part: PartPool, Field: f, Value: value, Reason: infrav1.StoragePoolNotAllowedReason, Message: err.Error()}}
}

func (p Policy) checkImage(img Image) []Refusal {
	var out []Refusal
	if v := img.Volume; v != nil {
		if f, err := p.CheckImageVolume(*v, img.DefaultPool); err != nil {
			value := v.Name
			if f == "pool" {
				value = v.Pool
			}
			out = append(out, Refusal{Part: PartImageVolume, Field: f, Value: value, Reason: infrav1.ImageNotAllowedReason, Message: err.Error()})
		}
	}
	if err := p.CheckImageURL(img.URL); err != nil {
		out = append(out, Refusal{Part: PartImageURL, Value: img.URL, Reason: infrav1.ImageNotAllowedReason, Message: err.Error()})
	}
	return out
}

// checkSizes refuses each size larger than the operator allows one VM,
// by field name.
func (p Policy) checkSizes(u Usage) []Refusal {
	exceeded := p.Machine.Exceeded(u, "--max-machine-")
	var out []Refusal
	for _, f := range slices.Sorted(maps.Keys(exceeded)) {
		out = append(out, Refusal{Part: PartSize, Field: f, Reason: infrav1.MachineSizeNotAllowedReason, Message: exceeded[f]})
	}
	return out
}

// checkNetwork checks a network's name and bridge, each when set.
func (p Policy) checkNetwork(namespace string, n Network) []Refusal {
	var out []Refusal
	if n.Name != "" {
		if err := p.CheckNetwork(namespace, n.Name); err != nil {
			out = append(out, Refusal{Part: PartNetwork, Field: "name", Value: n.Name, Reason: infrav1.NetworkNotAllowedReason, Message: err.Error()})
		}
	}
	if n.Bridge != "" {
		if err := p.CheckBridge(n.Bridge); err != nil {
			out = append(out, Refusal{Part: PartNetwork, Field: "bridge", Value: n.Bridge, Reason: infrav1.NetworkNotAllowedReason, Message: err.Error()})
		}
	}
	return out
}

func (p Policy) checkRecorded(namespace string, r Recorded) []Refusal {
	var out []Refusal
	if r.Pool != "" {
		if err := p.CheckPoolName(r.Pool); err != nil {
			out = append(out, Refusal{Part: PartRecordedPool, Value: r.Pool, Reason: infrav1.StoragePoolNotAllowedReason, Message: err.Error()})
		}
	}
	if r.Network != "" {
		// One refusal for the annotation, whichever of its halves is at
		// fault: the annotation is one value.
		if refused := p.checkNetwork(namespace, r.NetworkRef); len(refused) > 0 {
			out = append(out, Refusal{Part: PartRecordedNetwork, Value: r.Network, Reason: infrav1.NetworkNotAllowedReason, Message: refused[0].Message})
		}
	}
	return out
}
