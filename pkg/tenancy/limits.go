package tenancy

import (
	"fmt"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// Limits bound machines' sizes; a zero field sets no bound.
type Limits struct {
	// Machines and Clusters bound how many LibvirtMachines and
	// LibvirtClusters (each a network and maybe an HAProxy VM) a
	// namespace holds (Namespace only).
	Machines int
	Clusters int
	// VCPUs and MemoryMiB bound vCPUs and memory. DiskGiB bounds one
	// VM's disks, its root disk and data disks together (Machine), or what
	// a namespace's volumes take on the hosts (Namespace: root and data
	// disks at their full size, seeds, console logs and images at what
	// they occupy).
	VCPUs     int64
	MemoryMiB int64
	DiskGiB   int64
	// HostDevices bounds the PCI devices a namespace's domains pass
	// through together (Namespace only).
	HostDevices int
}

// DiskBytes is DiskGiB in bytes; 0 for no bound.
func (l Limits) DiskBytes() uint64 { return uint64(max(l.DiskGiB, 0)) << 30 }

// Usage is what VMs ask for or hold: their count and sizes, summed.
type Usage struct {
	Machines, Clusters int
	VCPUs, MemoryMiB   int64
	DiskGiB            int64
	HostDevices        int
}

// MachineUsage is what one machine of spec asks for.
func MachineUsage(spec *infrav1.LibvirtMachineSpec) Usage {
	disk := int64(spec.DiskSizeGiB)
	for _, d := range spec.DataDisks {
		disk += int64(d.SizeGiB)
	}
	return Usage{Machines: 1, VCPUs: int64(spec.CPUs), MemoryMiB: int64(spec.MemoryMiB), DiskGiB: disk, HostDevices: len(spec.HostDevices)}
}

// LoadBalancerUsage is what the HAProxy VM of spec asks for, defaults
// applied; zero when the cluster has none. Its disk is the image's size,
// known once imported (and then bounded by the operator's largest disk).
func LoadBalancerUsage(spec *infrav1.LibvirtClusterSpec) Usage {
	if spec.LoadBalancer.Type == infrav1.LoadBalancerNone {
		return Usage{}
	}
	hw := spec.LoadBalancer.VirtualHardware
	hw.Default(infrav1.DefaultLoadBalancerCPUs, infrav1.DefaultLoadBalancerMemoryMiB)
	return Usage{VCPUs: int64(hw.CPUs), MemoryMiB: int64(hw.MemoryMiB)}
}

// Add is u plus v.
func (u Usage) Add(v Usage) Usage {
	return Usage{Machines: u.Machines + v.Machines, Clusters: u.Clusters + v.Clusters,
		VCPUs: u.VCPUs + v.VCPUs, MemoryMiB: u.MemoryMiB + v.MemoryMiB, DiskGiB: u.DiskGiB + v.DiskGiB,
		HostDevices: u.HostDevices + v.HostDevices}
}

// Exceeded names, for every limit u passes, the field that passes it
// ("cpus", "memoryMiB", "diskSizeGiB", "machines", "clusters",
// "hostDevices") and the
// flag that sets it (prefix "--max-machine-" or "--namespace-max-").
func (l Limits) Exceeded(u Usage, flagPrefix string) map[string]string {
	out := map[string]string{}
	check := func(field, flag string, got, limit int64, unit string) {
		if limit > 0 && got > limit {
			out[field] = fmt.Sprintf("%d%s is more than the %d%s the operator allows (the manager's %s%s)", got, unit, limit, unit, flagPrefix, flag)
		}
	}
	check("machines", "machines", int64(u.Machines), int64(l.Machines), "")
	check("clusters", "clusters", int64(u.Clusters), int64(l.Clusters), "")
	check("cpus", "vcpus", u.VCPUs, l.VCPUs, " vCPUs")
	check("memoryMiB", "memory", u.MemoryMiB, l.MemoryMiB, " MiB")
	check("diskSizeGiB", "disk", u.DiskGiB, l.DiskGiB, " GiB of disk")
	check("hostDevices", "host-devices", int64(u.HostDevices), int64(l.HostDevices), " host devices")
	return out
}
