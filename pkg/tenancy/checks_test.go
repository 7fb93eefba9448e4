package tenancy

import (
	"slices"
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// refused is what a test expects of one refusal: what it is about, the
// condition reason, and a fragment of its message.
type refused struct {
	part   Part
	field  string
	index  int
	value  string
	reason string
	says   string
}

func checkRefusals(t *testing.T, got []Refusal, want []refused) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d refusals, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Part != w.part || g.Field != w.field || g.Index != w.index || g.Value != w.value || g.Reason != w.reason {
			t.Errorf("refusal %d = %s %q [%d] %q %s, want %s %q [%d] %q %s", i, g.Part, g.Field, g.Index, g.Value, g.Reason,
				w.part, w.field, w.index, w.value, w.reason)
		}
		if !strings.Contains(g.Message, w.says) {
			t.Errorf("refusal %d (%s) says %q, want it to say %q", i, g.Part, g.Message, w.says)
		}
	}
}

// Namespace team-b checks what it names against team-a's objects and an
// operator who listed pools, bridges, networks and bounds one machine.
var (
	strictPolicy = Policy{
		PoolDirs: []string{"/var/lib/libvirt"}, Pools: []string{"capi-libvirt", "tenants"}, ImagePools: []string{"capi-libvirt"},
		Bridges: []string{"br0"}, Networks: []string{"default"}, Machine: Limits{VCPUs: 4, MemoryMiB: 4096, DiskGiB: 50},
		NetworkCIDRs: DefaultPolicy().NetworkCIDRs,
	}
	networkA = naming.ClusterNetworkName("team-a", "prod")
	seedA    = naming.SeedVolumeName(naming.DomainName("team-a", "cp-0"))
	imported = naming.ImageVolumeName(strings.Repeat("ab", 32))
	globalIP = infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "GlobalInClusterIPPool", Name: "lan"}
	ownIP    = infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}
)

func TestCheckMachine(t *testing.T) {
	fine := MachineRefs{
		Pool:          Pool{Name: "tenants"},
		DataDiskPools: []string{"", "capi-libvirt"},
		Network:       Network{Bridge: "br0"},
		AddressPools:  []infrav1.IPPoolReference{ownIP},
		Image:         Image{Volume: &infrav1.VolumeReference{Name: imported}, DefaultPool: "tenants"},
		Usage:         Usage{Machines: 1, VCPUs: 4, MemoryMiB: 4096, DiskGiB: 50},
		Recorded:      Recorded{Pool: "tenants", Network: "bridge:br0", NetworkRef: Network{Bridge: "br0"}},
	}
	for _, tc := range []struct {
		name   string
		policy Policy
		mutate func(*MachineRefs)
		want   []refused
	}{
		{"within the policy", strictPolicy, nil, nil},
		{"pool not listed", strictPolicy, func(m *MachineRefs) { m.Pool.Name = "default" },
			[]refused{{PartPool, "name", 0, "default", infrav1.StoragePoolNotAllowedReason, "--storage-pools"}}},
		{"pool in /etc", strictPolicy, func(m *MachineRefs) { m.Pool.Path = "/etc/pool" },
			[]refused{{PartPool, "path", 0, "/etc/pool", infrav1.StoragePoolNotAllowedReason, "system directory /etc"}}},
		{"unknown pool (a template)", strictPolicy, func(m *MachineRefs) { m.Pool = Pool{} }, nil},
		{"another namespace's seed", strictPolicy, func(m *MachineRefs) { m.Image.Volume = &infrav1.VolumeReference{Name: seedA} },
			[]refused{{PartImageVolume, "name", 0, seedA, infrav1.ImageNotAllowedReason, "manages for a machine"}}},
		{"a volume of a pool that is not an image pool", strictPolicy, func(m *MachineRefs) {
			m.Image.Volume = &infrav1.VolumeReference{Pool: "tenants", Name: "ubuntu.qcow2"}
		}, []refused{{PartImageVolume, "pool", 0, "tenants", infrav1.ImageNotAllowedReason, "--image-pools"}}},
		{"a volume of an unknown pool", strictPolicy, func(m *MachineRefs) {
			m.Image = Image{Volume: &infrav1.VolumeReference{Name: "ubuntu.qcow2"}}
		}, nil},
		{"file:// image", strictPolicy, func(m *MachineRefs) { m.Image = Image{URL: "file:///etc/shadow"} },
			[]refused{{PartImageURL, "", 0, "file:///etc/shadow", infrav1.ImageNotAllowedReason, "--image-file-dirs"}}},
		{"each size over", strictPolicy, func(m *MachineRefs) { m.Usage = Usage{Machines: 1, VCPUs: 5, MemoryMiB: 4097, DiskGiB: 51} },
			[]refused{
				{PartSize, "cpus", 0, "", infrav1.MachineSizeNotAllowedReason, "--max-machine-vcpus"},
				{PartSize, "diskSizeGiB", 0, "", infrav1.MachineSizeNotAllowedReason, "--max-machine-disk"},
				{PartSize, "memoryMiB", 0, "", infrav1.MachineSizeNotAllowedReason, "--max-machine-memory"},
			}},
		{"a data disk's pool not listed", strictPolicy, func(m *MachineRefs) { m.DataDiskPools = []string{"", "default"} },
			[]refused{{PartDataDiskPool, "", 1, "default", infrav1.StoragePoolNotAllowedReason, "--storage-pools"}}},
		{"a host device not allowed", strictPolicy, func(m *MachineRefs) { m.HostDevices = []string{"gpu0"} },
			[]refused{{PartHostDevice, "", 0, "gpu0", infrav1.HostDeviceNotAllowedReason, "--host-devices lists none"}}},
		{"another namespace's network and a provider network's bridge", strictPolicy, func(m *MachineRefs) {
			m.Network = Network{Name: networkA, Bridge: netalloc.BridgeName(networkA)}
		}, []refused{
			{PartNetwork, "name", 0, networkA, infrav1.NetworkNotAllowedReason, "namespace team-a"},
			{PartNetwork, "bridge", 0, netalloc.BridgeName(networkA), infrav1.NetworkNotAllowedReason, "bridge of a network the provider made"},
		}},
		{"an IPAM pool not granted", strictPolicy, func(m *MachineRefs) { m.AddressPools = []infrav1.IPPoolReference{ownIP, globalIP} },
			[]refused{{PartIPAMPool, "", 1, "lan", infrav1.IPPoolNotAllowedReason, "not granted to namespace team-b"}}},
		{"forged placement", strictPolicy, func(m *MachineRefs) {
			m.Recorded = Recorded{Pool: "default", Network: "network:" + networkA, NetworkRef: Network{Name: networkA}}
		}, []refused{
			{PartRecordedPool, "", 0, "default", infrav1.StoragePoolNotAllowedReason, "--storage-pools"},
			{PartRecordedNetwork, "", 0, "network:" + networkA, infrav1.NetworkNotAllowedReason, "namespace team-a"},
		}},
		{"everything at once, in the order of the fields", strictPolicy, func(m *MachineRefs) {
			m.Pool.Name, m.Image.Volume, m.Usage.VCPUs = "default", &infrav1.VolumeReference{Name: seedA}, 8
			m.DataDiskPools, m.HostDevices, m.Network = []string{"lab"}, []string{"gpu0"}, Network{Bridge: "virbr0"}
			m.AddressPools, m.Recorded = []infrav1.IPPoolReference{globalIP}, Recorded{Pool: "lab"}
		}, []refused{
			{PartPool, "name", 0, "default", infrav1.StoragePoolNotAllowedReason, "--storage-pools"},
			{PartImageVolume, "name", 0, seedA, infrav1.ImageNotAllowedReason, "manages for a machine"},
			{PartSize, "cpus", 0, "", infrav1.MachineSizeNotAllowedReason, "8 vCPUs is more than the 4 vCPUs"},
			{PartDataDiskPool, "", 0, "lab", infrav1.StoragePoolNotAllowedReason, "--storage-pools"},
			{PartHostDevice, "", 0, "gpu0", infrav1.HostDeviceNotAllowedReason, "--host-devices"},
			{PartNetwork, "bridge", 0, "virbr0", infrav1.NetworkNotAllowedReason, "--host-bridges"},
			{PartIPAMPool, "", 0, "lan", infrav1.IPPoolNotAllowedReason, "--ipam-pools"},
			{PartRecordedPool, "", 0, "lab", infrav1.StoragePoolNotAllowedReason, "--storage-pools"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fine
			m.DataDiskPools, m.AddressPools = slices.Clone(fine.DataDiskPools), slices.Clone(fine.AddressPools)
			if tc.mutate != nil {
				tc.mutate(&m)
			}
			checkRefusals(t, tc.policy.CheckMachine("team-b", m), tc.want)
		})
	}
}

func TestCheckCluster(t *testing.T) {
	lb := func() *LoadBalancerRefs {
		return &LoadBalancerRefs{
			Image:       Image{Volume: &infrav1.VolumeReference{Name: infrav1.DefaultLoadBalancerImageVolume}, DefaultPool: "tenants"},
			Usage:       Usage{VCPUs: 1, MemoryMiB: 512},
			AddressPool: &ownIP,
		}
	}
	for _, tc := range []struct {
		name   string
		policy Policy
		mutate func(*ClusterRefs)
		want   []refused
	}{
		{"within the policy", strictPolicy, nil, nil},
		{"pool outside the pool directories", strictPolicy, func(c *ClusterRefs) { c.Pool.Path = "/srv/tenants" },
			[]refused{{PartPool, "path", 0, "/srv/tenants", infrav1.StoragePoolNotAllowedReason, "--storage-pool-dirs"}}},
		{"network not listed", strictPolicy, func(c *ClusterRefs) { c.Network.Name = "lab" },
			[]refused{{PartNetwork, "name", 0, "lab", infrav1.NetworkNotAllowedReason, "--libvirt-networks"}}},
		{"a public range", strictPolicy, func(c *ClusterRefs) { c.Network = infrav1.ClusterNetwork{CIDR: "8.8.8.0/24"} },
			[]refused{{PartNetworkCIDR, "", 0, "8.8.8.0/24", infrav1.NetworkNotAllowedReason, "--network-cidrs"}}},
		{"HAProxy VM over the bounds", strictPolicy, func(c *ClusterRefs) { c.LoadBalancer.Usage = Usage{VCPUs: 8, MemoryMiB: 8192} },
			[]refused{
				{PartSize, "cpus", 0, "", infrav1.MachineSizeNotAllowedReason, "--max-machine-vcpus"},
				{PartSize, "memoryMiB", 0, "", infrav1.MachineSizeNotAllowedReason, "--max-machine-memory"},
			}},
		{"no HAProxy VM: nothing of it checked", strictPolicy, func(c *ClusterRefs) {
			c.LoadBalancer = nil
		}, nil},
		{"everything at once, in the order of the fields", strictPolicy, func(c *ClusterRefs) {
			c.Pool, c.Network = Pool{Name: "root", Path: "/"}, infrav1.ClusterNetwork{CIDR: "8.8.8.0/24"}
			c.LoadBalancer.Image = Image{Volume: &infrav1.VolumeReference{Name: seedA}, URL: "file:///etc/shadow"}
			c.LoadBalancer.Usage.VCPUs, c.LoadBalancer.AddressPool = 5, &globalIP
			c.Recorded = Recorded{Pool: "default", Network: "bridge:virbr0", NetworkRef: Network{Bridge: "virbr0"}}
		}, []refused{
			{PartPool, "name", 0, "root", infrav1.StoragePoolNotAllowedReason, "--storage-pools"},
			{PartNetworkCIDR, "", 0, "8.8.8.0/24", infrav1.NetworkNotAllowedReason, "--network-cidrs"},
			{PartImageVolume, "name", 0, seedA, infrav1.ImageNotAllowedReason, "manages for a machine"},
			{PartImageURL, "", 0, "file:///etc/shadow", infrav1.ImageNotAllowedReason, "--image-file-dirs"},
			{PartSize, "cpus", 0, "", infrav1.MachineSizeNotAllowedReason, "--max-machine-vcpus"},
			{PartIPAMPool, "", 0, "lan", infrav1.IPPoolNotAllowedReason, "--ipam-pools"},
			{PartRecordedPool, "", 0, "default", infrav1.StoragePoolNotAllowedReason, "--storage-pools"},
			{PartRecordedNetwork, "", 0, "bridge:virbr0", infrav1.NetworkNotAllowedReason, "--host-bridges"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ClusterRefs{Pool: Pool{Name: "tenants", Path: "/var/lib/libvirt/tenants"}, Network: infrav1.ClusterNetwork{Bridge: "br0"},
				LoadBalancer: lb(), Recorded: Recorded{Pool: "tenants"}}
			if tc.mutate != nil {
				tc.mutate(&c)
			}
			checkRefusals(t, tc.policy.CheckCluster("team-b", c), tc.want)
		})
	}
}
