package hostdevice_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/hostdevice"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestRealDevicesRefused: the aliases an operator could get wrong, checked
// against this host's real node devices through the real libvirtd: its
// disk controller and its NIC (storage and network class) are refused
// unless allowed, a device with other IDs than the entry's is a
// mismatch, and with allow= the device still needs an IOMMU group of its
// own (this host has no IOMMU). No domain is defined.
func TestRealDevicesRefused(t *testing.T) {
	uri := testlibvirt.URI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := virt.Dial(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	disk := sysfsDevice(t, pci.KindStorage)
	nic := sysfsDevice(t, pci.KindNetwork)
	policy := parsePolicy(t,
		"disk0="+disk.String(), "host="+hostName(), "nic0="+nic.String(),
		"gpu0="+disk.String(), "host=elsewhere", "vendor=10de", "device=2204", "allow=storage") // the operator meant a GPU
	for _, tc := range []struct {
		alias, host, reason, inMsg string
	}{
		{"disk0", hostName(), infrav1.HostDeviceNotAllowedReason, "is a storage device (class 0x01"},
		{"nic0", hostName(), infrav1.HostDeviceNotAllowedReason, "is a network device (class 0x02"},
		{"gpu0", "elsewhere", infrav1.HostDeviceMismatchReason, "not the 10de:2204"},
		{"gpu0", hostName(), infrav1.WaitingForHostDeviceReason, "binds gpu0 to host elsewhere"},
	} {
		dev, err := policy.HostDevice(tc.alias)
		if err != nil {
			t.Fatal(err)
		}
		problem, err := hostdevice.Check(ctx, c, policy, dev, tc.host, "capl-test-none")
		if err != nil {
			t.Fatalf("%s: %v", tc.alias, err)
		}
		if problem == nil || problem.Reason != tc.reason || !strings.Contains(problem.Message, tc.inMsg) {
			t.Errorf("%s on %s: %+v; want %s saying %q", tc.alias, tc.host, problem, tc.reason, tc.inMsg)
			continue
		}
		t.Logf("%s on %s: %s: %s", tc.alias, tc.host, problem.Reason, problem.Message)
	}
	// Allowed as a network device, the NIC still needs an IOMMU group
	// that isolates it: none here.
	policy = parsePolicy(t, "nic1="+nic.String(), "allow=network")
	dev, _ := policy.HostDevice("nic1")
	problem, err := hostdevice.Check(ctx, c, policy, dev, hostName(), "capl-test-none")
	if err != nil {
		t.Fatal(err)
	}
	if _, statErr := os.Stat(filepath.Join("/sys/bus/pci/devices", nic.String(), "iommu_group")); statErr == nil {
		t.Logf("nic1: this host has an IOMMU: %+v", problem)
		if problem != nil && problem.Reason == infrav1.HostDeviceMismatchReason {
			t.Errorf("nic1: %+v", problem)
		}
		return
	}
	if problem == nil || problem.Reason != infrav1.HostDeviceNotAllowedReason || !strings.Contains(problem.Message, "in no IOMMU group") {
		t.Errorf("nic1 (allowed, no IOMMU): %+v; want HostDeviceNotAllowed for want of an IOMMU group", problem)
	}
}

func parsePolicy(t *testing.T, entries ...string) tenancy.Policy {
	t.Helper()
	devices, err := tenancy.ParseHostDevices(entries)
	if err != nil {
		t.Fatal(err)
	}
	return tenancy.Policy{HostDevices: devices}
}

// sysfsDevice is a PCI device of this host (the test's libvirt host) of
// kind k.
func sysfsDevice(t *testing.T, k pci.Kind) pci.Address {
	t.Helper()
	paths, _ := filepath.Glob("/sys/bus/pci/devices/*")
	for _, p := range paths {
		raw, err := os.ReadFile(filepath.Join(p, "class"))
		if err != nil {
			continue
		}
		class, err := pci.ParseClass(strings.TrimSpace(string(raw)))
		if err != nil || class.Kind() != k {
			continue
		}
		if addr, err := pci.ParseAddress(filepath.Base(p)); err == nil {
			return addr
		}
	}
	testprereq.Missing(t, "no PCI device of kind %s in /sys/bus/pci/devices", k)
	return pci.Address{}
}

func hostName() string {
	h, _ := os.Hostname()
	return h
}
