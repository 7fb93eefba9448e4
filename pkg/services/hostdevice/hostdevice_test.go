package hostdevice_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

var (
	gpu = pci.Address{Bus: 0x65}
	nic = pci.Address{Bus: 0x17, Function: 1}
)

func policy(t *testing.T) tenancy.Policy {
	t.Helper()
	devices, err := tenancy.ParseHostDevices([]string{"gpu0=0000:65:00.0/nvidia.com/gpu", "nic0=0000:17:00.1"})
	if err != nil {
		t.Fatal(err)
	}
	return tenancy.Policy{HostDevices: devices}
}

// TestHostDevicesPassedThrough: free devices reach the domain by address,
// in spec order; a device the machine's own domain names is free for it.
func TestHostDevicesPassedThrough(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.LM.Spec.HostDevices = []infrav1.HostDevice{{Name: "nic0"}, {Name: "gpu0"}}
	f.Host.PCIDevices = map[pci.Address]string{gpu: "nvidia", nic: "ixgbe"}
	f.Policy = policy(t)
	s, p := servicetest.Provision(t, f)
	for range 2 { // again once the domain exists and names them
		if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.HostDevices); err != nil {
			t.Fatal(err)
		}
		if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err != nil {
			t.Fatal(err)
		}
	}
	got := f.Host.Specs[naming.DomainName("ns", "m0")].HostDevices
	if len(got) != 2 || got[0] != nic || got[1] != gpu {
		t.Errorf("domain's host devices %v, want %s then %s", got, nic, gpu)
	}
}

// TestHostDeviceWaits: a device the host lacks or another running domain
// holds keeps the machine waiting with a reason, and no domain is
// defined; one only defined elsewhere, not running, does not (libvirt
// starts one of the two).
func TestHostDeviceWaits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		devices map[pci.Address]string
		other   string // the state of another domain that names the GPU; "" for none
		spec    string
		reason  string // "" when the machine goes ahead
	}{
		{name: "missing", devices: map[pci.Address]string{nic: "ixgbe"}, spec: "gpu0", reason: infrav1.WaitingForHostDeviceReason},
		{name: "held", devices: map[pci.Address]string{gpu: "vfio-pci"}, other: "running", spec: "gpu0", reason: infrav1.WaitingForHostDeviceReason},
		{name: "defined elsewhere, stopped", devices: map[pci.Address]string{gpu: "nvidia"}, other: "shutoff", spec: "gpu0"},
		{name: "not allowed", devices: map[pci.Address]string{gpu: "nvidia"}, spec: "gpu9", reason: infrav1.HostDeviceNotAllowedReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			f.LM.Spec.HostDevices = []infrav1.HostDevice{{Name: tc.spec}}
			f.Host.PCIDevices = tc.devices
			if tc.other != "" {
				f.Host.Specs["other"] = virt.DomainSpec{Name: "other", HostDevices: []pci.Address{gpu}}
				f.Host.Domains["other"] = virt.DomainInfo{Name: "other", State: tc.other}
			}
			f.Policy = policy(t)
			s, p := servicetest.Provision(t, f)
			err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.HostDevices)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("err = %v, want the device free", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error; want the machine to wait")
			}
			if _, ok := services.AsRequeue(err); !ok && tc.reason == infrav1.WaitingForHostDeviceReason {
				t.Errorf("err = %v, want a requeue", err)
			}
			servicetest.WantCondition(t, f.LM, infrav1.DomainReadyCondition, metav1.ConditionFalse, tc.reason)
			if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err == nil {
				t.Error("the domain step went ahead without its host devices")
			}
			if _, ok := f.Host.Domains[naming.DomainName("ns", "m0")]; ok {
				t.Error("a domain was defined without its host devices")
			}
		})
	}
}
