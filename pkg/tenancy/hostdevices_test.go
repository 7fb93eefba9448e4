package tenancy

import (
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
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("[%d] = %+v, want %+v", i, got[i], tc.want[i])
				}
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
