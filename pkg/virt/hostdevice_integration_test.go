package virt_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	// What the alias check reads: the IDs and class, as sysfs has them,
	// and the IOMMU group when the host has one.
	if want := sysfsIdentity(t, addr); info.IDs != want.IDs || info.Class != want.Class {
		t.Errorf("PCIDevice(%s): IDs %s, class %s; sysfs has %s, %s", addr, info.IDs, info.Class, want.IDs, want.Class)
	}
	_, groupErr := os.Stat(filepath.Join("/sys/bus/pci/devices", addr.String(), "iommu_group"))
	if (groupErr == nil) != (info.IOMMUGroup != nil) {
		t.Errorf("PCIDevice(%s): IOMMU group %+v; sysfs has one: %v", addr, info.IOMMUGroup, groupErr == nil)
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
	// The namespace totals count the domain's hostdev from libvirt.
	owned, err := e.c.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(owned, func(o virt.OwnedObject) bool { return o.Kind == virt.OwnedDomain && o.Name == spec.Name }); i < 0 || owned[i].HostDevices != 1 {
		t.Errorf("ListOwned: domain %s not listed with one host device (%+v)", spec.Name, owned)
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

// sysfsIdentity reads addr's IDs and class from sysfs.
func sysfsIdentity(t *testing.T, addr pci.Address) virt.PCIDeviceInfo {
	t.Helper()
	read := func(name string) string {
		raw, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", addr.String(), name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(raw))
	}
	var info virt.PCIDeviceInfo
	var err error
	if info.IDs.Vendor, err = pci.ParseID(read("vendor")); err != nil {
		t.Fatal(err)
	}
	if info.IDs.Device, err = pci.ParseID(read("device")); err != nil {
		t.Fatal(err)
	}
	if info.Class, err = pci.ParseClass(read("class")); err != nil {
		t.Fatal(err)
	}
	return info
}

// driverOf is the driver sysfs says is bound to addr, "" for none.
func driverOf(addr pci.Address) string {
	target, err := os.Readlink(filepath.Join("/sys/bus/pci/devices", addr.String(), "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}
