package virt

// DomainSpec describes a VM.
type DomainSpec struct {
	// Name is the libvirt domain name; callers derive it so that it cannot
	// collide across namespaces.
	Name string
	// UUID is chosen by the provider and persisted, so a rerun after a
	// crash finds its own domain and a replaced one is detected.
	UUID string
	// Owner is written into the domain's metadata.
	Owner Owner
	// Type is the hypervisor: "kvm" or "qemu" (TCG).
	Type string
	// CPUMode is "host-passthrough", "host-model" or "maximum" (TCG).
	CPUMode string
	// DisabledCPUFeatures are CPU features turned off with policy
	// "disable", e.g. "arch-capabilities" on hosts whose nested KVM
	// rejects that MSR.
	DisabledCPUFeatures []string
	VCPUs               uint
	MemoryMiB           uint64
	// TCGCacheMiB sets TCG's translation-block cache (0 keeps QEMU's
	// default); it only applies to Type "qemu".
	TCGCacheMiB uint64
	// DiskPath is the overlay volume's path on the libvirt host (from
	// VolumeInfo.Path); it is attached as a virtio disk of type "file".
	DiskPath string
	// DiskFormat is the disk's format; "qcow2" when empty.
	DiskFormat string
	// SeedISOPath is the NoCloud seed volume's path, attached as a cdrom on
	// virtio-scsi; empty for none.
	SeedISOPath string
	// Network is a libvirt network name; Bridge a host bridge. Exactly one
	// is set.
	Network string
	Bridge  string
	// MAC is the NIC's address (52:54:00:…), chosen and persisted by the
	// caller so DHCP reservations can be made before the first start.
	MAC string
	// ConsoleLogPath, when set, logs the serial console to this file on the
	// libvirt host (through virtlogd).
	ConsoleLogPath string
}

// DomainInfo describes a domain as libvirt sees it.
type DomainInfo struct {
	Name string
	UUID string
	// State is "running", "shutoff", "crashed", "paused", "blocked",
	// "shutdown" (shutting down), "pmsuspended" or "unknown".
	State string
	// Reason is libvirt's reason for State, e.g. "booted", "destroyed".
	Reason    string
	VCPUs     uint
	MemoryMiB uint64
	MAC       string
	Owner     *Owner
}
