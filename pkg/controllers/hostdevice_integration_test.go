package controllers_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// TestMachineHostDevices: with no webhook to stop them, a machine naming a
// host device the operator did not list is refused, and one naming a
// listed device its host does not have waits with a reason that names
// the device; neither gets a DHCP entry, a disk, a seed or a domain, and
// both leave nothing behind when deleted. No device can be passed through on this
// host (no IOMMU, no spare device): a machine that takes one is not run
// here (the golden XML and pkg/virt's TestPCIDeviceUsers cover the domain
// and the host's view of it).
func TestMachineHostDevices(t *testing.T) {
	h := newHarness(t)
	h.options = func(o *manager.Options) {
		o.HostDevices = []string{"gpu0=0000:fe:1f.7/nvidia.com/gpu"} // no such device here
	}
	defer func() { h.options = nil }()
	h.startProvider(nil)
	h.createCluster("hostdev", true)
	cases := []struct {
		machine, alias, reason, inMessage string
	}{
		{"absent", "gpu0", infrav1.WaitingForHostDeviceReason, "PCI device 0000:fe:1f.7 does not exist"},
		{"unlisted", "gpu1", infrav1.HostDeviceNotAllowedReason, "--host-devices"},
	}
	for _, c := range cases {
		h.createMachine(c.machine, machineOpts{cluster: "hostdev", withData: true, hostDevices: []infrav1.HostDevice{{Name: c.alias}}})
	}
	for _, c := range cases {
		lm := h.waitCondition(c.machine, infrav1.DomainReadyCondition, metav1.ConditionFalse, c.reason, 2*time.Minute)
		msg := conditions.Get(lm, infrav1.DomainReadyCondition).Message
		t.Logf("%s: %s", c.machine, msg)
		if !strings.Contains(msg, c.inMessage) {
			t.Errorf("%s: DomainReady says %q, want it to say %q", c.machine, msg, c.inMessage)
		}
	}
	// Both stop before anything is made: no reservation, disk, seed or
	// domain while a machine waits for its device.
	for _, c := range cases {
		h.assertNoLibvirtObjects(c.machine)
	}
	for _, c := range cases {
		h.deleteAndAssertClean(c.machine)
	}
}
