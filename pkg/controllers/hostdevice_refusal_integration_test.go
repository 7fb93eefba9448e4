package controllers_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

// TestMachineHostDeviceRefused: aliases of the operator's --host-devices
// that lead to the wrong device on this host (the test's libvirt host):
// one whose entry names a GPU's IDs but whose address is this host's
// host bridge (HostDeviceMismatch), and two at its disk
// controller and NIC without allow= (HostDeviceNotAllowed, storage and
// network class). Each machine is refused from libvirt's node device
// before anything exists: no DHCP entry, disk, seed or domain, and
// nothing is left when it is deleted. No domain takes a device here.
func TestMachineHostDeviceRefused(t *testing.T) {
	disk := sysfsPCIDevice(t, pci.KindStorage)
	nic := sysfsPCIDevice(t, pci.KindNetwork)
	bridge := sysfsPCIDevice(t, pci.KindBridge)
	h := newHarness(t)
	h.options = func(o *manager.Options) {
		o.HostDevices = []string{
			"gpu0=" + bridge.String() + "/nvidia.com/gpu", "vendor=10de", "device=2204", "allow=bridge",
			"disk1=" + disk.String(), "host=" + hosts.HostName(h.uri), "nic0=" + nic.String(), "host=" + hosts.HostName(h.uri),
		}
	}
	defer func() { h.options = nil }()
	h.startProvider(nil)
	h.createCluster("hostdevno", true)
	cases := []struct {
		machine, alias, reason, inMessage string
	}{
		{"wrongids", "gpu0", infrav1.HostDeviceMismatchReason, "not the 10de:2204"},
		{"disk", "disk1", infrav1.HostDeviceNotAllowedReason, "is a storage device"},
		{"nic", "nic0", infrav1.HostDeviceNotAllowedReason, "is a network device"},
	}
	for _, c := range cases {
		h.createMachine(c.machine, machineOpts{cluster: "hostdevno", withData: true, hostDevices: []infrav1.HostDevice{{Name: c.alias}}})
	}
	for _, c := range cases {
		lm := h.waitCondition(c.machine, infrav1.DomainReadyCondition, metav1.ConditionFalse, c.reason, 2*time.Minute)
		msg := conditions.Get(lm, infrav1.DomainReadyCondition).Message
		t.Logf("%s: %s", c.machine, msg)
		if !strings.Contains(msg, c.inMessage) {
			t.Errorf("%s: DomainReady says %q, want it to say %q", c.machine, msg, c.inMessage)
		}
	}
	for _, c := range cases {
		h.assertNoLibvirtObjects(c.machine)
	}
	for _, c := range cases {
		h.deleteAndAssertClean(c.machine)
	}
}

// sysfsPCIDevice is a PCI device of this host of kind k.
func sysfsPCIDevice(t *testing.T, k pci.Kind) pci.Address {
	t.Helper()
	paths, _ := filepath.Glob("/sys/bus/pci/devices/*")
	for _, p := range paths {
		raw, err := os.ReadFile(filepath.Join(p, "class"))
		if err != nil {
			continue
		}
		if class, err := pci.ParseClass(strings.TrimSpace(string(raw))); err != nil || class.Kind() != k {
			continue
		}
		if addr, err := pci.ParseAddress(filepath.Base(p)); err == nil {
			return addr
		}
	}
	testprereq.Missing(t, "no PCI device of kind %s in /sys/bus/pci/devices", k)
	return pci.Address{}
}
