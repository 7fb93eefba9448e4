package virt_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestPCIDeviceUsers: libvirt's node devices and the domains that pass one
// through, on the real libvirtd. This host has no IOMMU and nothing to
// pass through, so the domain naming one of its PCI devices is defined and
// never started (starting it would take the device from the host); what
// is checked is what placement reads: the device exists, its driver, and
// which domains name it, running or not.
func TestPCIDeviceUsers(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	addr := hostPCIDevice(t)

	info, err := e.c.PCIDevice(ctx, addr)
	if err != nil {
		t.Fatalf("PCIDevice(%s): %v", addr, err)
	}
	if info.Driver == "" {
		t.Errorf("PCIDevice(%s): no driver reported (sysfs has %s)", addr, driverOf(addr))
	}
	for _, u := range info.Domains {
		t.Errorf("PCIDevice(%s): domain %s passes it through before the test defined one", addr, u.Name)
	}

	spec := e.lifecycleSpec(t)
	spec.HostDevices = []pci.Address{addr}
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatalf("defining a domain that passes %s through: %v", addr, err)
	}
	info, err = e.c.PCIDevice(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Domains) != 1 || info.Domains[0] != (virt.PCIDeviceUser{Name: spec.Name, Active: false}) {
		t.Errorf("PCIDevice(%s).Domains = %+v; want %s, not running", addr, info.Domains, spec.Name)
	}
	if other := info.HeldByOther("another"); other != "" {
		t.Errorf("a defined, stopped domain holds the device for another: %s", other)
	}

	if _, err := e.c.PCIDevice(ctx, pci.Address{Domain: 0xfff0, Bus: 0xfe}); !virt.IsNotFound(err) {
		t.Errorf("PCIDevice of an address the host does not have: %v, want not found", err)
	}
}

// hostPCIDevice is a PCI device of this host with a driver bound, the
// local host being the test's libvirt host.
func hostPCIDevice(t *testing.T) pci.Address {
	t.Helper()
	paths, _ := filepath.Glob("/sys/bus/pci/devices/*")
	for _, p := range paths {
		addr, err := pci.ParseAddress(filepath.Base(p))
		if err == nil && driverOf(addr) != "" {
			return addr
		}
	}
	testprereq.Missing(t, "no PCI device with a driver in /sys/bus/pci/devices")
	return pci.Address{}
}

// driverOf is the driver sysfs says is bound to addr, "" for none.
func driverOf(addr pci.Address) string {
	target, err := os.Readlink(filepath.Join("/sys/bus/pci/devices", addr.String(), "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}
