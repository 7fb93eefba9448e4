package hostdevice_test

import (
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/hostdevice"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestJudge: what a host says of the device at an alias's address decides
// whether a domain may take it. The operator's IDs must match; disk
// controllers, NICs and bridges pass only with allow=; the device's
// IOMMU group may hold only devices the host does not use; and no other
// running domain may hold it.
func TestJudge(t *testing.T) {
	nvidia := pci.IDs{Vendor: 0x10de, Device: 0x2204}
	vga := pci.Class(0x030000)
	audio := pci.Address{Bus: 0x65, Function: 1}
	disk := pci.Address{Bus: 0x01}
	rootPort := pci.Address{Slot: 0x01, Function: 1}
	group := func(others ...virt.PCIGroupMember) *virt.IOMMUGroup {
		return &virt.IOMMUGroup{Number: 14, Others: others}
	}
	entries := []string{"gpu0=0000:65:00.0/nvidia.com/gpu", "vendor=10de", "device=2204", "gpu0-audio=0000:65:00.1", "host=gpu1",
		"nic0=0000:17:00.0", "vendor=8086", "device=1572", "allow=network", "any0=0000:17:00.1"}
	devices, err := tenancy.ParseHostDevices(entries)
	if err != nil {
		t.Fatal(err)
	}
	policy := tenancy.Policy{HostDevices: devices}
	dev := func(alias string) tenancy.HostDevice {
		d, err := policy.HostDevice(alias)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name   string
		alias  string
		host   string // "" for gpu1
		info   virt.PCIDeviceInfo
		reason string // "" when the domain may take it
		inMsg  string
	}{
		{name: "the GPU, alone in its group", alias: "gpu0", info: virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group()}},
		{name: "another vendor's device at the address", alias: "gpu0",
			info:   virt.PCIDeviceInfo{IDs: pci.IDs{Vendor: 0x8086, Device: 0x1572}, Class: 0x020000, IOMMUGroup: group()},
			reason: infrav1.HostDeviceMismatchReason, inMsg: "is 8086:1572 (vendor:device), not the 10de:2204"},
		{name: "the vendor's other device", alias: "gpu0", info: virt.PCIDeviceInfo{IDs: pci.IDs{Vendor: 0x10de, Device: 0x1eb8}, Class: vga, IOMMUGroup: group()},
			reason: infrav1.HostDeviceMismatchReason, inMsg: "10de:1eb8"},
		{name: "no IDs given: an NVMe controller at the address", alias: "any0", info: virt.PCIDeviceInfo{IDs: pci.IDs{Vendor: 0x144d, Device: 0xa808}, Class: 0x010802, IOMMUGroup: group()},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "is a storage device (class 0x010802)"},
		{name: "no IDs given: a NIC", alias: "any0", info: virt.PCIDeviceInfo{IDs: pci.IDs{Vendor: 0x8086, Device: 0x1572}, Class: 0x020000, IOMMUGroup: group()},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "allow=network"},
		{name: "no IDs given: a PCI bridge", alias: "any0", info: virt.PCIDeviceInfo{Class: 0x060400, IOMMUGroup: group()},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "bridge device"},
		{name: "a NIC the operator allows", alias: "nic0", info: virt.PCIDeviceInfo{IDs: pci.IDs{Vendor: 0x8086, Device: 0x1572}, Class: 0x020000, IOMMUGroup: group()}},
		{name: "no IOMMU", alias: "gpu0", info: virt.PCIDeviceInfo{IDs: nvidia, Class: vga},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "in no IOMMU group"},
		{name: "group shared with the host's disk controller", alias: "gpu0",
			info:   virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(virt.PCIGroupMember{Address: disk, Driver: "nvme", Class: 0x010802})},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "shares IOMMU group 14 with 0000:01:00.0 (driver nvme)"},
		{name: "group member libvirt does not know", alias: "gpu0",
			info:   virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(virt.PCIGroupMember{Address: disk, Unknown: true})},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "unknown to libvirt"},
		{name: "group member on vfio-pci, unbound, or on pci-stub", alias: "gpu0",
			info: virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(
				virt.PCIGroupMember{Address: disk, Driver: "vfio-pci"}, virt.PCIGroupMember{Address: pci.Address{Bus: 2}},
				virt.PCIGroupMember{Address: pci.Address{Bus: 3}, Driver: "pci-stub"})}},
		{name: "group member the operator lists for this host (the GPU's audio function)", alias: "gpu0",
			info: virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(virt.PCIGroupMember{Address: audio, Driver: "snd_hda_intel", Class: 0x040300})}},
		{name: "group member the operator lists for another host only", alias: "gpu0", host: "gpu2",
			info:   virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(virt.PCIGroupMember{Address: audio, Driver: "snd_hda_intel", Class: 0x040300})},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "0000:65:00.1 (driver snd_hda_intel)"},
		{name: "group shared with a root port on its port driver", alias: "gpu0",
			info: virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(virt.PCIGroupMember{Address: rootPort, Driver: "pcieport", Class: 0x060400})}},
		{name: "group shared with a host bridge", alias: "gpu0",
			info:   virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(virt.PCIGroupMember{Address: rootPort, Driver: "pcieport", Class: 0x060000})},
			reason: infrav1.HostDeviceNotAllowedReason, inMsg: "shares IOMMU group"},
		{name: "held by another running domain", alias: "gpu0",
			info:   virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(), Domains: []virt.PCIDeviceUser{{Name: "other", Active: true}}},
			reason: infrav1.WaitingForHostDeviceReason, inMsg: "held by the running domain other"},
		{name: "named by its own domain, running", alias: "gpu0",
			info: virt.PCIDeviceInfo{IDs: nvidia, Class: vga, IOMMUGroup: group(), Domains: []virt.PCIDeviceUser{{Name: "mine", Active: true}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := tc.host
			if host == "" {
				host = "gpu1"
			}
			got := hostdevice.Judge(policy, dev(tc.alias), host, tc.info, "mine")
			switch {
			case tc.reason == "" && got != nil:
				t.Fatalf("refused: %+v", *got)
			case tc.reason == "":
				return
			case got == nil:
				t.Fatalf("allowed; want %s saying %q", tc.reason, tc.inMsg)
			case got.Reason != tc.reason || !strings.Contains(got.Message, tc.inMsg):
				t.Errorf("got %s %q; want %s saying %q", got.Reason, got.Message, tc.reason, tc.inMsg)
			}
			t.Logf("%s: %s", got.Reason, got.Message)
		})
	}
}
