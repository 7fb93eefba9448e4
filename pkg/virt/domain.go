package virt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

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
	// CPUMode is "host-passthrough", "host-model", "maximum" or "custom"
	// (CPUModel with CPUFeatures).
	CPUMode string
	// CPUModel is the named CPU model of mode "custom" (qemu64, Nehalem,
	// ...), which must exist on the host, with no fallback to another.
	CPUModel string
	// CPUFeatures are features the custom model must also have (sse4.2,
	// popcnt, aes, ...); the domain does not start without them.
	CPUFeatures []string
	VCPUs       uint
	MemoryMiB   uint64
	// TCGCacheMiB sets TCG's translation-block cache (0 keeps QEMU's
	// default); it only applies to Type "qemu".
	TCGCacheMiB uint64
	// CPUShares is the domain's CPU weight against other domains (cputune
	// shares); 0 keeps the host's default.
	CPUShares uint
	// DiskPath is the overlay volume's path on the libvirt host (from
	// VolumeInfo.Path); it is attached as a virtio disk of type "file".
	DiskPath string
	// DiskFormat is the disk's format; "qcow2" when empty.
	DiskFormat string
	// DiskBackingPath and DiskBackingFormat are the overlay's base image
	// (VolumeInfo.BackingPath and BackingFormat); empty for a disk without
	// one. The domain names the whole chain and ends it there, so QEMU and
	// libvirt follow no file name a base image's header might carry.
	DiskBackingPath, DiskBackingFormat string
	// SeedISOPath is the NoCloud seed volume's path, attached as a cdrom on
	// virtio-scsi; empty for none.
	SeedISOPath string
	// DataDisks are attached after the root disk, as virtio disks vdb,
	// vdc, ... in order.
	DataDisks []DataDisk
	// HostDevices are PCI devices of the host passed through whole, with
	// VFIO, managed by libvirt (detached from their host driver while the
	// domain runs).
	HostDevices []pci.Address
	// Network is a libvirt network name; Bridge a host bridge. Exactly one
	// is set.
	Network string
	Bridge  string
	// MAC is the NIC's address (52:54:00:…), chosen and persisted by the
	// caller so DHCP reservations can be made before the first start.
	MAC netalloc.MAC
	// TrafficFilter is the libvirt nwfilter bound to the NIC (e.g.
	// CleanTrafficFilter), empty for none. The guest's address is learned
	// from its own DHCP exchange; before that it sends nothing but DHCP.
	TrafficFilter string
	// StaticAddresses are the NIC's addresses when the guest holds them
	// without DHCP (IPAM pools): the traffic filter lets the guest use
	// those IPv4 addresses only, instead of learning one from DHCP. They
	// are recorded in the domain's ownership metadata too
	// (DomainInfo.StaticAddresses).
	StaticAddresses []netip.Addr
	// ConsoleLogPath, when set, logs the serial console to this file on the
	// libvirt host (through virtlogd).
	ConsoleLogPath string
}

// DataDisk is an empty volume attached to a domain besides its root disk.
type DataDisk struct {
	// Path is the volume's path on the libvirt host (VolumeInfo.Path).
	Path string
	// Serial is the disk's virtio serial: the guest sees the disk as
	// /dev/disk/by-id/virtio-<Serial>. At most 20 characters.
	Serial string
}

// maxDataDisks bounds a domain's data disks: vdb to vdi.
const maxDataDisks = 8

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
	MAC       netalloc.MAC
	Owner     *Owner
	// StaticAddresses are the addresses the domain was defined to hold
	// statically (DomainSpec.StaticAddresses), as its ownership metadata
	// records them, or else as its traffic filter's IP parameters do
	// (domains defined before they were recorded); nil for a guest that
	// takes DHCP.
	StaticAddresses []netip.Addr
}

// withDomain looks up a domain by name and frees it after fn.
func withDomain(conn *libvirt.Connect, name string, fn func(*libvirt.Domain) error) error {
	dom, err := conn.LookupDomainByName(name)
	return use(dom, err, "domain "+name, fn)
}

// EnsureDomain defines the domain with spec's UUID, or returns the existing
// one when the name already carries that UUID: a rerun after a crash
// converges without duplicates. A domain of that name with another UUID,
// or of that UUID with another name, was replaced outside the provider and
// yields a DomainReplacedError; it is left untouched. An existing domain is
// not redefined: changing a VM's shape is the caller's explicit decision.
func (c *Client) EnsureDomain(ctx context.Context, spec DomainSpec) (DomainInfo, error) {
	d, err := domainXML(spec)
	if err != nil {
		return DomainInfo{}, err
	}
	doc, err := d.Marshal()
	if err != nil {
		return DomainInfo{}, err
	}
	var info DomainInfo
	err = c.withConn(ctx, "EnsureDomain", func(conn *libvirt.Connect) error {
		dom, err := conn.LookupDomainByName(spec.Name)
		if IsNotFound(err) {
			if err := checkUUIDFree(conn, spec); err != nil {
				return err
			}
			dom, err = conn.DomainDefineXMLFlags(doc, libvirt.DOMAIN_DEFINE_VALIDATE)
			if err != nil {
				return fmt.Errorf("defining domain %s: %w", spec.Name, err)
			}
		} else if err != nil {
			return err
		}
		defer dom.Free()
		info, err = describeDomain(dom)
		if err != nil {
			return err
		}
		if !strings.EqualFold(info.UUID, spec.UUID) {
			return &DomainReplacedError{Name: spec.Name, ExpectedUUID: strings.ToLower(spec.UUID), ActualUUID: info.UUID}
		}
		return nil
	})
	if err != nil {
		return DomainInfo{}, err
	}
	c.rememberOwner(info.UUID, info.Owner)
	return info, nil
}

// checkUUIDFree fails when spec's UUID already belongs to a domain of
// another name.
func checkUUIDFree(conn *libvirt.Connect, spec DomainSpec) error {
	dom, err := conn.LookupDomainByUUIDString(spec.UUID)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dom.Free()
	other, err := dom.GetName()
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: UUID %s belongs to domain %s, not %s", ErrDomainReplaced, spec.UUID, other, spec.Name)
}

// DomainInfo describes the named domain; IsNotFound(err) when it does not
// exist.
func (c *Client) DomainInfo(ctx context.Context, name string) (DomainInfo, error) {
	var info DomainInfo
	err := c.withConn(ctx, "DomainInfo", func(conn *libvirt.Connect) error {
		return withDomain(conn, name, func(dom *libvirt.Domain) error {
			var err error
			info, err = describeDomain(dom)
			return err
		})
	})
	return info, err
}

// describeDomain reads state and definition of a domain.
func describeDomain(dom *libvirt.Domain) (DomainInfo, error) {
	state, reason, err := dom.GetState()
	if err != nil {
		return DomainInfo{}, err
	}
	d, err := decodeXML[libvirtxml.Domain](dom.GetXMLDesc(0))
	if err != nil {
		return DomainInfo{}, err
	}
	info := DomainInfo{Name: d.Name, UUID: strings.ToLower(d.UUID)}
	info.State, info.Reason = stateString(state, reason)
	if d.VCPU != nil {
		info.VCPUs = d.VCPU.Value
	}
	if d.Memory != nil {
		info.MemoryMiB = memoryMiB(d.Memory)
	}
	if d.Devices != nil && len(d.Devices.Interfaces) > 0 && d.Devices.Interfaces[0].MAC != nil {
		info.MAC = netalloc.CanonicalMAC(d.Devices.Interfaces[0].MAC.Address)
	}
	if d.Metadata != nil {
		o, err := ParseOwner(d.Metadata.XML)
		if err != nil && !IsNotFound(err) {
			return DomainInfo{}, err
		}
		info.Owner = o
	}
	info.StaticAddresses = staticAddressesOf(d)
	return info, nil
}

// memoryMiB converts libvirt's memory element (KiB unless a unit says
// otherwise) to MiB.
func memoryMiB(m *libvirtxml.DomainMemory) uint64 {
	kib := map[string]uint64{"": 1, "KiB": 1, "k": 1, "K": 1, "MiB": 1 << 10, "M": 1 << 10, "GiB": 1 << 20, "G": 1 << 20,
		"b": 0, "bytes": 0}[m.Unit]
	if kib == 0 {
		return uint64(m.Value) >> 20
	}
	return uint64(m.Value) * kib >> 10
}

// StartDomain starts a defined domain; one already running is success.
// libvirt's reason for a failed start is returned as a DomainStartError.
func (c *Client) StartDomain(ctx context.Context, name string) error {
	return c.withConn(ctx, "StartDomain", func(conn *libvirt.Connect) error {
		return withDomain(conn, name, func(dom *libvirt.Domain) error {
			active, err := dom.IsActive()
			if err != nil || active {
				return err
			}
			err = dom.Create()
			var lerr libvirt.Error
			switch {
			case err == nil:
				return nil
			case errors.As(err, &lerr) && lerr.Code == libvirt.ERR_OPERATION_INVALID && strings.Contains(lerr.Message, "already running"):
				return nil
			case errors.As(err, &lerr):
				// The cause stays reachable, so withConn still recognises a
				// connection loss and retries.
				return wrapNoSpace("", &DomainStartError{Name: name, Message: lerr.Message, cause: err})
			default:
				return &DomainStartError{Name: name, Message: err.Error(), cause: err}
			}
		})
	})
}

// ShutdownDomain asks the guest to power off (guest agent, else ACPI power
// button), waits up to timeout for it to stop, then destroys it. A stopped
// or missing domain is success.
func (c *Client) ShutdownDomain(ctx context.Context, name string, timeout time.Duration) error {
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := c.Subscribe(subCtx)
	var uuid string
	err := c.withConn(ctx, "ShutdownDomain", func(conn *libvirt.Connect) error {
		return withDomain(conn, name, func(dom *libvirt.Domain) error {
			active, err := dom.IsActive()
			if err != nil || !active {
				return err
			}
			if uuid, err = dom.GetUUIDString(); err != nil {
				return err
			}
			err = dom.ShutdownFlags(libvirt.DOMAIN_SHUTDOWN_GUEST_AGENT | libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
			if isNotRunning(err) {
				return nil
			}
			return err
		})
	})
	if err != nil || uuid == "" {
		return ignoreNotFound(err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// Events make the common case prompt; the poll covers events lost to
	// a reconnect or a full buffer.
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-events:
			if ev.UUID != uuid || (ev.Kind != EventDomainStopped && ev.Kind != EventDomainCrashed) {
				continue
			}
			return nil
		case <-poll.C:
			info, err := c.DomainInfo(ctx, name)
			if IsNotFound(err) || err == nil && (info.State == "shutoff" || info.State == "crashed") {
				return nil
			}
		case <-deadline.C:
			return c.destroy(ctx, name)
		}
	}
}

// destroy powers a domain off hard; stopped or missing is success.
func (c *Client) destroy(ctx context.Context, name string) error {
	return ignoreNotFound(c.withConn(ctx, "DestroyDomain", func(conn *libvirt.Connect) error {
		return withDomain(conn, name, destroyDomain)
	}))
}

func destroyDomain(dom *libvirt.Domain) error {
	if err := dom.Destroy(); err != nil && !isNotRunning(err) {
		return err
	}
	return nil
}

// isNotRunning recognises libvirt refusing an operation because the domain
// is already off.
func isNotRunning(err error) bool {
	var lerr libvirt.Error
	return errors.As(err, &lerr) && lerr.Code == libvirt.ERR_OPERATION_INVALID && strings.Contains(lerr.Message, "not running")
}

// undefineFlags also removes NVRAM, managed-save images and snapshot and
// checkpoint metadata, any of which makes a plain undefine fail.
const undefineFlags = libvirt.DOMAIN_UNDEFINE_NVRAM | libvirt.DOMAIN_UNDEFINE_MANAGED_SAVE |
	libvirt.DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.DOMAIN_UNDEFINE_CHECKPOINTS_METADATA

// DeleteDomain destroys the domain if it runs and undefines it together
// with its NVRAM, managed-save image and snapshot/checkpoint metadata.
// Volumes are not touched. A missing domain is success.
func (c *Client) DeleteDomain(ctx context.Context, name string) error {
	return ignoreNotFound(c.withConn(ctx, "DeleteDomain", func(conn *libvirt.Connect) error {
		return withDomain(conn, name, func(dom *libvirt.Domain) error {
			// The undefined event can only name the owner if it is known
			// before the metadata disappears with the definition.
			if uuid, err := dom.GetUUIDString(); err == nil {
				if o, err := domainOwner(dom); err == nil {
					c.rememberOwner(uuid, o)
				}
			}
			if err := destroyDomain(dom); err != nil {
				return fmt.Errorf("destroying %s: %w", name, err)
			}
			err := dom.UndefineFlags(undefineFlags)
			var lerr libvirt.Error
			if errors.As(err, &lerr) && (lerr.Code == libvirt.ERR_NO_SUPPORT || lerr.Code == libvirt.ERR_INVALID_ARG) {
				// Drivers without NVRAM or checkpoint support reject the
				// flags rather than ignore them.
				err = dom.Undefine()
			}
			if err != nil {
				return fmt.Errorf("undefining %s: %w", name, err)
			}
			return nil
		})
	}))
}

// stateString names a domain state and its reason the way virsh does.
func stateString(state libvirt.DomainState, reason int) (string, string) {
	var reasons []string
	var name string
	switch state {
	case libvirt.DOMAIN_RUNNING:
		name = "running"
		reasons = []string{"unknown", "booted", "migrated", "restored", "from-snapshot", "unpaused",
			"migration-canceled", "save-canceled", "wakeup", "crashed", "post-copy", "post-copy-failed"}
	case libvirt.DOMAIN_BLOCKED:
		name, reasons = "blocked", []string{"unknown"}
	case libvirt.DOMAIN_PAUSED:
		name = "paused"
		reasons = []string{"unknown", "user", "migration", "save", "dump", "ioerror", "watchdog", "from-snapshot",
			"shutdown", "snapshot", "crashed", "starting-up", "post-copy", "post-copy-failed", "api-error"}
	case libvirt.DOMAIN_SHUTDOWN:
		name, reasons = "shutdown", []string{"unknown", "user"}
	case libvirt.DOMAIN_SHUTOFF:
		name = "shutoff"
		reasons = []string{"unknown", "shutdown", "destroyed", "crashed", "migrated", "saved", "failed", "from-snapshot", "daemon"}
	case libvirt.DOMAIN_CRASHED:
		name, reasons = "crashed", []string{"unknown", "panicked"}
	case libvirt.DOMAIN_PMSUSPENDED:
		name, reasons = "pmsuspended", []string{"unknown"}
	default:
		return "unknown", fmt.Sprintf("reason-%d", reason)
	}
	if reason >= 0 && reason < len(reasons) {
		return name, reasons[reason]
	}
	return name, fmt.Sprintf("reason-%d", reason)
}
