package tenancy

import (
	"reflect"
	"strings"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

func TestParseHostDevices(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []string
		want    []HostDevice
		wantErr string
	}{
		{name: "none", entries: []string{"none"}},
		{name: "empty", entries: nil},
		{name: "gpu and nic", entries: []string{"gpu0=0000:65:00.0/nvidia.com/gpu", " nic0=17:00.1 "}, want: []HostDevice{
			{Alias: "gpu0", Address: pci.Address{Bus: 0x65}, Resource: "nvidia.com/gpu"},
			{Alias: "nic0", Address: pci.Address{Bus: 0x17, Function: 1}},
		}},
		{name: "no alias", entries: []string{"0000:65:00.0"}, wantErr: "ALIAS=ADDRESS"},
		{name: "alias not a label", entries: []string{"GPU_0=0000:65:00.0"}, wantErr: "ALIAS=ADDRESS"},
		{name: "not an address", entries: []string{"gpu0=/dev/nvidia0"}, wantErr: "not a PCI address"},
		{name: "resource without a domain", entries: []string{"gpu0=0000:65:00.0/gpu"}, wantErr: "extended resource"},
		{name: "alias twice", entries: []string{"gpu0=0000:65:00.0", "gpu0=0000:66:00.0"}, wantErr: "listed already"},
		{name: "address twice", entries: []string{"gpu0=0000:65:00.0", "gpu1=65:00.0"}, wantErr: "listed already"},
		{name: "IDs, host and allow, split at commas as the flag splits them", entries: []string{
			"gpu0=0000:65:00.0/nvidia.com/gpu", "vendor=10de", "device=0x2204",
			"nic0=0000:17:00.1", "vendor=8086", "device=1572", "host=qemu+ssh://router.lab/system", "allow=network", "allow=network",
			"nic1=0000:17:00.1", "host=edge.lab", "allow=network", "allow=bridge",
		}, want: []HostDevice{
			{Alias: "gpu0", Address: pci.Address{Bus: 0x65}, Resource: "nvidia.com/gpu", IDs: pci.IDs{Vendor: 0x10de, Device: 0x2204}},
			{Alias: "nic0", Address: pci.Address{Bus: 0x17, Function: 1}, IDs: pci.IDs{Vendor: 0x8086, Device: 0x1572}, Host: "router.lab", Allow: []pci.Kind{pci.KindNetwork}},
			{Alias: "nic1", Address: pci.Address{Bus: 0x17, Function: 1}, Host: "edge.lab", Allow: []pci.Kind{pci.KindNetwork, pci.KindBridge}},
		}},
		{name: "the same address on every host and on one", entries: []string{"gpu0=0000:65:00.0", "gpu1=0000:65:00.0", "host=a"}, wantErr: "listed already"},
		{name: "vendor without device", entries: []string{"gpu0=0000:65:00.0", "vendor=10de"}, wantErr: "go together"},
		{name: "device ID not hex", entries: []string{"gpu0=0000:65:00.0", "vendor=10de", "device=rtx"}, wantErr: "not a PCI ID"},
		{name: "vendor 0", entries: []string{"gpu0=0000:65:00.0", "vendor=0", "device=1"}, wantErr: "names no device"},
		{name: "allow what is not a kind", entries: []string{"gpu0=0000:65:00.0", "allow=everything"}, wantErr: "storage, network or bridge"},
		{name: "host URI without a host", entries: []string{"gpu0=0000:65:00.0", "host=qemu:///system"}, wantErr: "must name its host"},
		{name: "option before any alias", entries: []string{"vendor=10de", "gpu0=0000:65:00.0"}, wantErr: "follows its alias"},
		{name: "an option key is no alias", entries: []string{"host=0000:65:00.0"}, wantErr: "follows its alias"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHostDevices(tc.entries)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestHostDeviceAliases: tenants name devices by alias only; the error
// says which aliases exist and which flag lists them.
func TestHostDeviceAliases(t *testing.T) {
	devices, err := ParseHostDevices([]string{"gpu0=0000:65:00.0", "nic0=0000:17:00.1"})
	if err != nil {
		t.Fatal(err)
	}
	p := Policy{HostDevices: devices}
	if d, err := p.HostDevice("nic0"); err != nil || d.Address != (pci.Address{Bus: 0x17, Function: 1}) {
		t.Errorf("HostDevice(nic0) = %+v, %v", d, err)
	}
	for _, tc := range []struct {
		policy Policy
		name   string
		want   string
	}{
		{p, "gpu1", "gpu0, nic0 (the manager's --host-devices)"},
		{p, "0000:65:00.0", "must be one of"},
		{Policy{}, "gpu0", "--host-devices lists none"},
	} {
		if _, err := tc.policy.HostDevice(tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("HostDevice(%q) = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
