package virt

import (
	"fmt"
	"net"
	"net/netip"
	"path"
	"slices"
	"strings"

	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// Domain types and CPU modes a DomainSpec may name.
const (
	DomainTypeKVM  = "kvm"
	DomainTypeQEMU = "qemu"

	CPUModeHostPassthrough = "host-passthrough"
	CPUModeHostModel       = "host-model"
	CPUModeMaximum         = "maximum"
	CPUModeCustom          = "custom"
)

// CleanTrafficFilter is libvirt's nwfilter that drops a guest's frames
// with another MAC than its NIC's, IPv4 packets with another source
// address than its own, spoofed ARP, and every other L2 protocol: a
// machine on a shared segment cannot pose as another host, the gateway or
// its DHCP server.
const CleanTrafficFilter = "clean-traffic"

// GuestAgentChannel is the virtio-serial port name qemu-guest-agent
// listens on.
const GuestAgentChannel = "org.qemu.guest_agent.0"

// ConsoleLogDir is where DefaultConsoleLogPath puts serial console logs on
// the libvirt host: virtlogd already writes QEMU's own logs there, with the
// permissions and rotation that directory has.
const ConsoleLogDir = "/var/log/libvirt/qemu"

// DefaultConsoleLogPath is the serial console log of the named domain on
// the libvirt host.
func DefaultConsoleLogPath(domain string) string {
	return path.Join(ConsoleLogDir, domain+"-console.log")
}

// validateDomainSpec rejects specs libvirt would accept but the provider
// must not produce.
func validateDomainSpec(s DomainSpec) error {
	var errs []string
	if s.Name == "" {
		errs = append(errs, "name is empty")
	}
	if _, err := uuid.Parse(s.UUID); err != nil {
		errs = append(errs, fmt.Sprintf("uuid %q: %v", s.UUID, err))
	}
	if s.Type != DomainTypeKVM && s.Type != DomainTypeQEMU {
		errs = append(errs, fmt.Sprintf("type %q is neither kvm nor qemu", s.Type))
	}
	switch s.CPUMode {
	case CPUModeHostPassthrough, CPUModeHostModel, CPUModeMaximum:
		if s.CPUModel != "" || len(s.CPUFeatures) > 0 {
			errs = append(errs, fmt.Sprintf("cpu mode %q takes no model or features", s.CPUMode))
		}
	case CPUModeCustom:
		if s.CPUModel == "" {
			errs = append(errs, "cpu mode custom needs a model")
		}
	default:
		errs = append(errs, fmt.Sprintf("cpu mode %q is not one of host-passthrough, host-model, maximum, custom", s.CPUMode))
	}
	if s.VCPUs == 0 || s.MemoryMiB == 0 {
		errs = append(errs, "vcpus and memory must be positive")
	}
	if !path.IsAbs(s.DiskPath) {
		errs = append(errs, fmt.Sprintf("disk path %q is not absolute", s.DiskPath))
	}
	if s.DiskBackingPath != "" && (!path.IsAbs(s.DiskBackingPath) || (s.DiskBackingFormat != FormatQCOW2 && s.DiskBackingFormat != FormatRaw)) {
		errs = append(errs, fmt.Sprintf("backing file %q (%q) is not an absolute path of a raw or qcow2 image", s.DiskBackingPath, s.DiskBackingFormat))
	}
	if s.SeedISOPath != "" && !path.IsAbs(s.SeedISOPath) {
		errs = append(errs, fmt.Sprintf("seed ISO path %q is not absolute", s.SeedISOPath))
	}
	if len(s.DataDisks) > maxDataDisks {
		errs = append(errs, fmt.Sprintf("%d data disks, at most %d", len(s.DataDisks), maxDataDisks))
	}
	for _, disk := range s.DataDisks {
		if !path.IsAbs(disk.Path) || disk.Serial == "" || len(disk.Serial) > 20 || strings.ContainsFunc(disk.Serial, notSerialRune) {
			errs = append(errs, fmt.Sprintf("data disk %q (serial %q) needs an absolute path and a serial of 1-20 letters, digits and dashes", disk.Path, disk.Serial))
		}
	}
	for i, addr := range s.HostDevices {
		if slices.Contains(s.HostDevices[:i], addr) {
			errs = append(errs, fmt.Sprintf("host device %s passed through twice", addr))
		}
	}
	if s.Network != "" && s.Bridge != "" {
		errs = append(errs, "both network and bridge are set")
	}
	if s.Network != "" || s.Bridge != "" {
		if hw, err := net.ParseMAC(s.MAC.String()); err != nil || len(hw) != 6 || hw[0]&1 != 0 {
			errs = append(errs, fmt.Sprintf("mac %q is not a unicast Ethernet address", s.MAC))
		}
	}
	if s.TCGCacheMiB != 0 && s.Type != DomainTypeQEMU {
		errs = append(errs, "a TCG cache size needs domain type qemu")
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid domain spec: %s", strings.Join(errs, "; "))
	}
	return nil
}

// notSerialRune tells which runes a disk serial may not hold: QEMU passes
// it to the guest, whose udev names /dev/disk/by-id after it.
func notSerialRune(r rune) bool {
	return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '-'
}

// domainXML builds the domain definition for spec. Disks are attached by
// path as type "file": AppArmor's virt-aa-helper cannot resolve
// type "volume", and the paths are the libvirt host's (from VolumeInfo), so
// remote URIs work. The seed ISO sits on virtio-scsi because cloud kernels
// lack AHCI/IDE drivers and would not see a SATA cdrom.
func domainXML(s DomainSpec) (*libvirtxml.Domain, error) {
	if err := validateDomainSpec(s); err != nil {
		return nil, err
	}
	owner, err := s.Owner.metadataXML(s.StaticAddresses)
	if err != nil {
		return nil, err
	}
	port0, index0 := uint(0), uint(0)
	d := &libvirtxml.Domain{
		Type:          s.Type,
		Name:          s.Name,
		UUID:          strings.ToLower(s.UUID),
		Metadata:      &libvirtxml.DomainMetadata{XML: owner},
		Memory:        &libvirtxml.DomainMemory{Value: uint(s.MemoryMiB), Unit: "MiB"},
		CurrentMemory: &libvirtxml.DomainCurrentMemory{Value: uint(s.MemoryMiB), Unit: "MiB"},
		VCPU:          &libvirtxml.DomainVCPU{Placement: "static", Value: s.VCPUs},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
		},
		Features: &libvirtxml.DomainFeatureList{
			ACPI: &libvirtxml.DomainFeature{},
			APIC: &libvirtxml.DomainFeatureAPIC{},
		},
		CPU:        domainCPU(s),
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{{
				Device:       "disk",
				Driver:       &libvirtxml.DomainDiskDriver{Name: "qemu", Type: defaultString(s.DiskFormat, FormatQCOW2), Discard: "unmap"},
				Source:       &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: s.DiskPath}},
				BackingStore: diskChain(s.DiskBackingPath, s.DiskBackingFormat),
				Target:       &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
				Boot:         &libvirtxml.DomainDeviceBoot{Order: 1},
			}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: &port0},
				Log:    consoleLog(s.ConsoleLogPath),
			}},
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port0},
			}},
			Channels: []libvirtxml.DomainChannel{{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: GuestAgentChannel}},
			}},
			// Guests block on entropy early in boot without it, which TCG
			// makes painfully visible.
			RNGs: []libvirtxml.DomainRNG{{
				Model:   "virtio",
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
			}},
		},
	}
	if s.CPUShares > 0 {
		d.CPUTune = &libvirtxml.DomainCPUTune{Shares: &libvirtxml.DomainCPUTuneShares{Value: s.CPUShares}}
	}
	if s.TCGCacheMiB > 0 {
		d.Features.TCG = &libvirtxml.DomainFeatureTCG{TBCache: &libvirtxml.DomainFeatureTCGTBCache{Unit: "MiB", Size: uint(s.TCGCacheMiB)}}
	}
	for i, disk := range s.DataDisks {
		d.Devices.Disks = append(d.Devices.Disks, libvirtxml.DomainDisk{
			Device:       "disk",
			Driver:       &libvirtxml.DomainDiskDriver{Name: "qemu", Type: FormatQCOW2, Discard: "unmap"},
			Source:       &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: disk.Path}},
			BackingStore: diskChain("", ""),
			Target:       &libvirtxml.DomainDiskTarget{Dev: "vd" + string(rune('b'+i)), Bus: "virtio"},
			Serial:       disk.Serial,
		})
	}
	if s.SeedISOPath != "" {
		d.Devices.Controllers = []libvirtxml.DomainController{{Type: "scsi", Index: &index0, Model: "virtio-scsi"}}
		d.Devices.Disks = append(d.Devices.Disks, libvirtxml.DomainDisk{
			Device:       "cdrom",
			Driver:       &libvirtxml.DomainDiskDriver{Name: "qemu", Type: FormatRaw},
			Source:       &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: s.SeedISOPath}},
			BackingStore: diskChain("", ""),
			Target:       &libvirtxml.DomainDiskTarget{Dev: "sda", Bus: "scsi"},
			ReadOnly:     &libvirtxml.DomainDiskReadOnly{},
		})
	}
	for _, addr := range s.HostDevices {
		d.Devices.Hostdevs = append(d.Devices.Hostdevs, hostdevXML(addr))
	}
	if nic := domainInterface(s); nic != nil {
		d.Devices.Interfaces = []libvirtxml.DomainInterface{*nic}
	}
	return d, nil
}

// diskChain is a disk's backing chain as libvirt is told it: the base
// file, if any, then an empty <backingStore/>, which ends the chain. Told
// the chain, libvirt neither probes image headers for more of it nor
// hands QEMU a file it did not list (nor chowns one for it).
func diskChain(basePath, baseFormat string) *libvirtxml.DomainDiskBackingStore {
	end := &libvirtxml.DomainDiskBackingStore{}
	if basePath == "" {
		return end
	}
	return &libvirtxml.DomainDiskBackingStore{
		Format:       &libvirtxml.DomainDiskFormat{Type: baseFormat},
		Source:       &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: basePath}},
		BackingStore: end,
	}
}

func domainCPU(s DomainSpec) *libvirtxml.DomainCPU {
	cpu := &libvirtxml.DomainCPU{Mode: s.CPUMode}
	switch s.CPUMode {
	case CPUModeHostPassthrough, CPUModeMaximum:
		// Only meaningful for host-model and custom; libvirt warns
		// otherwise, and "none" keeps the definition stable.
		cpu.Check = "none"
	case CPUModeCustom:
		// Exactly the model and features asked for: a guest measured or
		// tuned with one CPU must not silently get another.
		cpu.Match = "exact"
		cpu.Model = &libvirtxml.DomainCPUModel{Value: s.CPUModel, Fallback: "forbid"}
		for _, f := range s.CPUFeatures {
			cpu.Features = append(cpu.Features, libvirtxml.DomainCPUFeature{Policy: "require", Name: f})
		}
	}
	return cpu
}

// domainInterface is the NIC on a libvirt network or host bridge; nil when
// the spec names neither (used by lifecycle tests that need no network).
func domainInterface(s DomainSpec) *libvirtxml.DomainInterface {
	nic := &libvirtxml.DomainInterface{
		MAC:   &libvirtxml.DomainInterfaceMAC{Address: s.MAC.Canonical().String()},
		Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"},
	}
	switch {
	case s.Network != "":
		nic.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: s.Network}}
	case s.Bridge != "":
		nic.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: s.Bridge}}
	default:
		return nil
	}
	if s.TrafficFilter != "" {
		nic.FilterRef = &libvirtxml.DomainInterfaceFilterRef{Filter: s.TrafficFilter, Parameters: filterParameters(s.StaticAddresses)}
	}
	return nic
}

// filterParameters pin the traffic filter to a guest's IPv4 addresses:
// those it holds statically (the filter's IP parameters), or else the one
// it leases, learnt from DHCP rather than from the first packet, which
// leaves a guest no moment to claim an address it was not given.
func filterParameters(static []netip.Addr) []libvirtxml.DomainInterfaceFilterParam {
	var params []libvirtxml.DomainInterfaceFilterParam
	for _, a := range static {
		if a.Is4() {
			params = append(params, libvirtxml.DomainInterfaceFilterParam{Name: "IP", Value: a.String()})
		}
	}
	if len(params) == 0 {
		return []libvirtxml.DomainInterfaceFilterParam{{Name: "CTRL_IP_LEARNING", Value: "dhcp"}}
	}
	return params
}

// consoleLog has virtlogd on the libvirt host append the serial console to
// file; the path is the host's, so this works over remote URIs too.
func consoleLog(file string) *libvirtxml.DomainChardevLog {
	if file == "" {
		return nil
	}
	return &libvirtxml.DomainChardevLog{File: file, Append: "on"}
}

func defaultString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
