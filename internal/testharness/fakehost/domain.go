package fakehost

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The fake of virt.DomainHost: domains and host memory.
var _ virt.DomainHost = (*Host)(nil)

// EnsureDomain defines a shut-off domain or returns the existing one.
func (h *Host) EnsureDomain(_ context.Context, spec virt.DomainSpec) (virt.DomainInfo, error) {
	if err := h.call("EnsureDomain"); err != nil {
		return virt.DomainInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d, ok := h.Domains[spec.Name]; ok {
		if !strings.EqualFold(d.UUID, spec.UUID) {
			return virt.DomainInfo{}, &virt.DomainReplacedError{Name: spec.Name, ExpectedUUID: spec.UUID, ActualUUID: d.UUID}
		}
		return d, nil
	}
	owner := spec.Owner
	d := virt.DomainInfo{Name: spec.Name, UUID: strings.ToLower(spec.UUID), State: "shutoff", Reason: "unknown",
		VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB, MAC: spec.MAC, Owner: &owner}
	h.Domains[spec.Name] = d
	h.Specs[spec.Name] = spec
	return d, nil
}

// StartDomain marks a domain running.
func (h *Host) StartDomain(_ context.Context, name string) error {
	if err := h.call("StartDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.Domains[name]
	if !ok {
		return notFound("domain " + name)
	}
	d.State, d.Reason = "running", "booted"
	h.Domains[name] = d
	return nil
}

// ShutdownDomain marks a domain shut off.
func (h *Host) ShutdownDomain(_ context.Context, name string, _ time.Duration) error {
	if err := h.call("ShutdownDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d, ok := h.Domains[name]; ok {
		d.State, d.Reason = "shutoff", "shutdown"
		h.Domains[name] = d
	}
	return nil
}

// DeleteDomain removes a domain; missing is success.
func (h *Host) DeleteDomain(_ context.Context, name string) error {
	if err := h.call("DeleteDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.Domains, name)
	return nil
}

// DomainInfo describes a domain.
func (h *Host) DomainInfo(_ context.Context, name string) (virt.DomainInfo, error) {
	if err := h.call("DomainInfo"); err != nil {
		return virt.DomainInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.Domains[name]
	if !ok {
		return d, notFound("domain " + name)
	}
	return d, nil
}

// HostMemory reports MemoryBytes.
func (h *Host) HostMemory(context.Context) (uint64, error) {
	if err := h.call("HostMemory"); err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.MemoryBytes, nil
}

// PCIDevice reports a device of PCIDevices with the domains whose spec
// passes it through, active when they run; IsNotFound for another address.
func (h *Host) PCIDevice(_ context.Context, addr pci.Address) (virt.PCIDeviceInfo, error) {
	if err := h.call("PCIDevice"); err != nil {
		return virt.PCIDeviceInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	driver, ok := h.PCIDevices[addr]
	if !ok {
		return virt.PCIDeviceInfo{}, fmt.Errorf("node device %s: %w", addr.NodeDeviceName(), virt.ErrNotFound)
	}
	info, ok := h.PCIIdentities[addr]
	if !ok {
		info.IOMMUGroup = &virt.IOMMUGroup{Number: int(addr.Bus)<<8 | int(addr.Slot)<<3 | int(addr.Function)}
	}
	info.Driver, info.Domains = driver, nil
	for _, name := range slices.Sorted(maps.Keys(h.Specs)) {
		if slices.Contains(h.Specs[name].HostDevices, addr) {
			info.Domains = append(info.Domains, virt.PCIDeviceUser{Name: name, Active: h.Domains[name].State == "running"})
		}
	}
	return info, nil
}
