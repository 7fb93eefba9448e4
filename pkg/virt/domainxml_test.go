package virt

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

// baseSpec is a valid product-default spec the cases below vary.
func baseSpec() DomainSpec {
	return DomainSpec{
		Name:      "capl-default-worker-0",
		UUID:      "6F1C2B9E-2D4A-4C55-9B7B-0A1E2F3D4C5B",
		Owner:     Owner{Kind: "LibvirtMachine", Namespace: "default", Name: "worker-0", UID: "0b5c8f0e-1111-2222-3333-444455556666", Cluster: "demo"},
		Type:      DomainTypeKVM,
		CPUMode:   CPUModeHostPassthrough,
		VCPUs:     2,
		MemoryMiB: 2048,
		DiskPath:  "/var/lib/libvirt/capl-images/capl-default-worker-0-disk",
		// The base is pinned: libvirt must not read the chain from headers.
		DiskBackingPath:   "/var/lib/libvirt/capl-images/capl-image-0123",
		DiskBackingFormat: FormatQCOW2,
		SeedISOPath:       "/var/lib/libvirt/capl-images/capl-default-worker-0-seed.iso",
		Network:           "capl-demo",
		MAC:               "52:54:00:AB:CD:EF",
		ConsoleLogPath:    DefaultConsoleLogPath("capl-default-worker-0"),
	}
}

func TestDomainXMLGolden(t *testing.T) {
	tests := []struct {
		golden string
		mutate func(*DomainSpec)
	}{
		{"domain-kvm-passthrough.xml", func(*DomainSpec) {}},
		{"domain-tcg-bridge.xml", func(s *DomainSpec) {
			s.Type, s.CPUMode, s.TCGCacheMiB, s.CPUShares = DomainTypeQEMU, CPUModeMaximum, 128, 4096
			s.Network, s.Bridge = "", "br0"
			s.ConsoleLogPath = ""
			s.TrafficFilter = CleanTrafficFilter
		}},
		{"domain-static-address.xml", func(s *DomainSpec) {
			s.Network, s.Bridge = "", "br0"
			s.TrafficFilter = CleanTrafficFilter
			// IPv6 is not the filter's: clean-traffic pins IPv4 only.
			s.StaticAddresses = []netip.Addr{netip.MustParseAddr("10.231.0.210"), netip.MustParseAddr("fd00::10")}
		}},
		{"domain-tcg-custom-cpu.xml", func(s *DomainSpec) {
			s.Type, s.CPUMode, s.CPUModel, s.CPUFeatures = DomainTypeQEMU, CPUModeCustom, "qemu64", []string{"sse4.2", "popcnt"}
		}},
		{"domain-data-disks.xml", func(s *DomainSpec) {
			s.DataDisks = []DataDisk{
				{Path: "/var/lib/libvirt/capl-images/capl-default-worker-0_data-etcd.qcow2", Serial: "etcd"},
				{Path: "/var/lib/libvirt/capl-images/capl-default-worker-0_data-longhorn.qcow2", Serial: "longhorn"},
			}
		}},
		{"domain-host-devices.xml", func(s *DomainSpec) {
			s.HostDevices = []pci.Address{{Bus: 0x65}, {Domain: 1, Bus: 0x17, Slot: 0x1f, Function: 1}}
		}},
		{"domain-host-model-no-seed-no-nic.xml", func(s *DomainSpec) {
			s.CPUMode = CPUModeHostModel
			s.SeedISOPath, s.Network, s.MAC = "", "", ""
			s.DiskFormat, s.DiskBackingPath, s.DiskBackingFormat = FormatRaw, "", ""
		}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			s := baseSpec()
			tt.mutate(&s)
			d, err := domainXML(s)
			if err != nil {
				t.Fatal(err)
			}
			assertGoldenXML(t, tt.golden, d)
		})
	}
}

func TestValidateDomainSpec(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*DomainSpec)
		wantErr string
	}{
		{"valid", func(*DomainSpec) {}, ""},
		{"no name", func(s *DomainSpec) { s.Name = "" }, "name is empty"},
		{"bad uuid", func(s *DomainSpec) { s.UUID = "nope" }, "uuid"},
		{"bad type", func(s *DomainSpec) { s.Type = "xen" }, "neither kvm nor qemu"},
		{"bad cpu mode", func(s *DomainSpec) { s.CPUMode = "host" }, "cpu mode"},
		{"custom without model", func(s *DomainSpec) { s.CPUMode = CPUModeCustom }, "needs a model"},
		{"model without custom", func(s *DomainSpec) { s.CPUModel = "Nehalem" }, "takes no model"},
		{"custom model", func(s *DomainSpec) {
			s.CPUMode, s.CPUModel, s.CPUFeatures = CPUModeCustom, "qemu64", []string{"sse4.2"}
		}, ""},
		{"no memory", func(s *DomainSpec) { s.MemoryMiB = 0 }, "positive"},
		{"relative disk", func(s *DomainSpec) { s.DiskPath = "disk.qcow2" }, "disk path"},
		{"relative seed", func(s *DomainSpec) { s.SeedISOPath = "seed.iso" }, "seed ISO path"},
		{"network and bridge", func(s *DomainSpec) { s.Bridge = "br0" }, "both network and bridge"},
		{"bad mac", func(s *DomainSpec) { s.MAC = "52:54:00:zz:00:01" }, "mac"},
		{"multicast mac", func(s *DomainSpec) { s.MAC = "01:54:00:00:00:01" }, "unicast"},
		{"tcg cache on kvm", func(s *DomainSpec) { s.TCGCacheMiB = 64 }, "TCG cache"},
		{"relative backing file", func(s *DomainSpec) { s.DiskBackingPath = "base.qcow2" }, "backing file"},
		{"backing file of unknown format", func(s *DomainSpec) { s.DiskBackingFormat = "" }, "raw or qcow2"},
		{"vmdk backing file", func(s *DomainSpec) { s.DiskBackingFormat = "vmdk" }, "raw or qcow2"},
		{"data disk", func(s *DomainSpec) { s.DataDisks = []DataDisk{{Path: "/pool/d.qcow2", Serial: "data-0"}} }, ""},
		{"relative data disk", func(s *DomainSpec) { s.DataDisks = []DataDisk{{Path: "d.qcow2", Serial: "d"}} }, "data disk"},
		{"data disk without serial", func(s *DomainSpec) { s.DataDisks = []DataDisk{{Path: "/pool/d.qcow2"}} }, "data disk"},
		{"serial too long", func(s *DomainSpec) {
			s.DataDisks = []DataDisk{{Path: "/pool/d.qcow2", Serial: strings.Repeat("d", 21)}}
		}, "data disk"},
		{"serial with a quote", func(s *DomainSpec) { s.DataDisks = []DataDisk{{Path: "/pool/d.qcow2", Serial: "d'x"}} }, "data disk"},
		{"host device", func(s *DomainSpec) { s.HostDevices = []pci.Address{{Bus: 0x65}} }, ""},
		{"host device twice", func(s *DomainSpec) { s.HostDevices = []pci.Address{{Bus: 0x65}, {Bus: 0x65}} }, "passed through twice"},
		{"nine data disks", func(s *DomainSpec) {
			for range 9 {
				s.DataDisks = append(s.DataDisks, DataDisk{Path: "/pool/d.qcow2", Serial: "d"})
			}
		}, "at most 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseSpec()
			tt.mutate(&s)
			err := validateDomainSpec(s)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("want error containing %q, got %v", tt.wantErr, err)
			}
		})
	}
}
