// Package fakehost is an in-memory virt.Host for unit tests of the scope
// and the services, one file per role of virt.Host (storage.go,
// network.go, domain.go, guest.go). Integration tests use the real
// libvirtd instead.
package fakehost

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Host implements virt.Host in memory. The methods it does not model
// (unfaked.go) fail, naming themselves. Errs[method] makes that method
// fail. Tests that fake one method more embed it by value.
type Host struct {
	mu sync.Mutex
	// Volumes maps "pool/name" to the volume; Data holds uploaded bytes.
	Volumes map[string]virt.VolumeInfo
	Data    map[string][]byte
	Pools   map[string]virt.PoolSpec
	// Domains maps name to its info; Specs keeps what EnsureDomain got.
	Domains map[string]virt.DomainInfo
	Specs   map[string]virt.DomainSpec
	// Entries are reservations per network; Leases per network (MAC → IP).
	Entries map[string][]virt.Reservation
	Leases  map[string]map[string]netip.Addr
	// NoDHCP networks have no reservations (ErrNoDHCP).
	NoDHCP map[string]bool
	// Files are guest files per domain ("domain:path").
	Files map[string][]byte
	// Images maps a source to its sha256 for ImportImage.
	Images map[string]string
	// PCIDevices are the host's PCI devices and their drivers; the
	// domains passing one through come from Specs.
	PCIDevices map[pci.Address]string
	// PCIIdentities are what PCIDevice reports of a device besides its
	// driver and users (IDs, class, IOMMU group); a device of PCIDevices
	// without one is alone in an IOMMU group of its own.
	PCIIdentities map[pci.Address]virt.PCIDeviceInfo
	// MemoryBytes is what HostMemory reports; New sets 16 GiB.
	MemoryBytes uint64
	// Errs makes the named method return the error.
	Errs map[string]error
	// Calls records method names in order.
	Calls []string
	// Watches records WatchLease calls ("network/mac").
	Watches []string
	// OnCall, when set, runs at the start of every call.
	OnCall func(method string)
}

// New returns an empty host with one NAT network "net" (192.168.100.0/24).
func New() *Host {
	return &Host{
		Volumes: map[string]virt.VolumeInfo{}, Data: map[string][]byte{}, Pools: map[string]virt.PoolSpec{},
		Domains: map[string]virt.DomainInfo{}, Specs: map[string]virt.DomainSpec{},
		Entries: map[string][]virt.Reservation{"net": nil}, Leases: map[string]map[string]netip.Addr{},
		NoDHCP: map[string]bool{}, Files: map[string][]byte{}, Images: map[string]string{}, Errs: map[string]error{},
		MemoryBytes: 16 << 30,
	}
}

func (h *Host) call(method string) error {
	h.mu.Lock()
	h.Calls = append(h.Calls, method)
	hook := h.OnCall
	err := h.Errs[method]
	h.mu.Unlock()
	if hook != nil {
		hook(method)
	}
	return err
}

// Called tells whether method was called.
func (h *Host) Called(method string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.Calls {
		if c == method {
			return true
		}
	}
	return false
}

func notFound(what string) error { return fmt.Errorf("%s: %w", what, virt.ErrNotFound) }

// Subscribe returns a channel closed when ctx ends.
func (h *Host) Subscribe(ctx context.Context) <-chan virt.Event {
	ch := make(chan virt.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

var _ virt.Host = (*Host)(nil)
