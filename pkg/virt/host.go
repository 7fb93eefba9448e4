package virt

import (
	"context"
	"os"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

// Host is everything the controllers may do to a libvirt host, as the
// roles its callers use: a service depends on the role it needs
// (StorageHost, NetworkHost, DomainHost, GuestHost). It speaks only this
// package's small structs, never libvirt types, and offers no raw
// connection, so controllers are unit-tested against fakes. *Client is the
// real implementation.
type Host interface {
	StorageHost
	NetworkHost
	DomainHost
	GuestHost

	// ListOwned lists every domain and network carrying our ownership
	// metadata and every volume whose name carries our prefix.
	ListOwned(ctx context.Context) ([]OwnedObject, error)

	// Subscribe streams host events until ctx ends.
	Subscribe(ctx context.Context) <-chan Event
}

// StorageHost covers storage pools and volumes: base images, overlays,
// seeds and console logs.
type StorageHost interface {
	// EnsurePool defines, builds, starts and autostarts a directory pool,
	// then refreshes it. Idempotent.
	EnsurePool(ctx context.Context, spec PoolSpec) error
	// ImportImage brings a base image into a pool once, verified against
	// its sha256; an existing complete volume is reused.
	ImportImage(ctx context.Context, img ImageImport) (VolumeInfo, error)
	// EnsureOverlay creates a qcow2 overlay on a base volume, or returns the
	// existing one (grown, never shrunk, to the requested capacity).
	EnsureOverlay(ctx context.Context, spec OverlaySpec) (VolumeInfo, error)
	// UploadVolume writes data into a raw volume with mode 0600 (NoCloud
	// seeds); the content is replaced on every call.
	UploadVolume(ctx context.Context, pool, name string, data []byte) (VolumeInfo, error)
	// DeleteVolume deletes a volume; a missing volume or pool is success.
	DeleteVolume(ctx context.Context, pool, name string) error
	// VolumeInfo describes a volume; IsNotFound(err) when it does not exist.
	VolumeInfo(ctx context.Context, pool, name string) (VolumeInfo, error)
	// ReadVolume returns up to the first limit bytes of a volume (a seed);
	// IsNotFound(err) when it does not exist.
	ReadVolume(ctx context.Context, pool, name string, limit int64) ([]byte, error)
	// EnsureDataVolume returns an empty qcow2 volume of capacity bytes (a
	// machine's data disk), created when missing, never resized.
	EnsureDataVolume(ctx context.Context, pool, name string, capacity uint64) (VolumeInfo, error)
	// EnsureLogVolume returns the 0600 volume a console log goes to,
	// created empty when missing; DeleteLogVolume removes it with the
	// files virtlogd rotated out of it.
	EnsureLogVolume(ctx context.Context, pool, name string) (VolumeInfo, error)
	DeleteLogVolume(ctx context.Context, pool, name string) error
}

// DomainHost covers domains and the host capacity they are checked against.
type DomainHost interface {
	// EnsureDomain defines the domain unless it exists with spec.UUID;
	// ErrDomainReplaced when the name exists with another UUID.
	EnsureDomain(ctx context.Context, spec DomainSpec) (DomainInfo, error)
	// StartDomain starts a defined domain; running already is success.
	StartDomain(ctx context.Context, name string) error
	// ShutdownDomain asks the guest to power off and destroys it after
	// timeout; a stopped or missing domain is success.
	ShutdownDomain(ctx context.Context, name string, timeout time.Duration) error
	// DeleteDomain destroys and undefines a domain; missing is success.
	DeleteDomain(ctx context.Context, name string) error
	// DomainInfo describes a domain; IsNotFound(err) when it does not exist.
	DomainInfo(ctx context.Context, name string) (DomainInfo, error)
	// HostMemory is the libvirt host's total physical memory in bytes, to
	// refuse machines that could never run there.
	HostMemory(ctx context.Context) (uint64, error)
	// PCIDevice describes a PCI device of the host and the domains that
	// pass it through; IsNotFound(err) when the host has none at addr.
	PCIDevice(ctx context.Context, addr pci.Address) (PCIDeviceInfo, error)
}

// GuestHost covers what a running guest's agent answers.
type GuestHost interface {
	// GuestExec runs a program in the guest through the guest agent and
	// waits for it to exit.
	GuestExec(ctx context.Context, domain, path string, args []string, stdin []byte) (ExecResult, error)
	// GuestReadFile reads a guest file; IsNotFound(err) when it is absent.
	GuestReadFile(ctx context.Context, domain, path string) ([]byte, error)
	// GuestWriteFile writes a guest file atomically with the given mode.
	GuestWriteFile(ctx context.Context, domain, path string, data []byte, mode os.FileMode) error
	// GuestInterfaces lists the guest's interfaces and addresses as the
	// guest agent reports them.
	GuestInterfaces(ctx context.Context, domain string) ([]GuestInterface, error)
}

var _ Host = (*Client)(nil)
