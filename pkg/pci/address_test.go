package pci

import "testing"

func TestParseAddress(t *testing.T) {
	for _, tc := range []struct {
		in       string
		want     Address
		wantNode string
		wantErr  bool
	}{
		{in: "0000:65:00.0", want: Address{Bus: 0x65}, wantNode: "pci_0000_65_00_0"},
		{in: "65:00.1", want: Address{Bus: 0x65, Function: 1}, wantNode: "pci_0000_65_00_1"},
		{in: "10DE:0a:1f.7", want: Address{Domain: 0x10de, Bus: 0x0a, Slot: 0x1f, Function: 7}, wantNode: "pci_10de_0a_1f_7"},
		{in: "0000:65:20.0", wantErr: true}, // slot has 5 bits
		{in: "0000:65:00.8", wantErr: true}, // function has 3 bits
		{in: "0000:65:00", wantErr: true},
		{in: "/sys/bus/pci/devices/0000:65:00.0", wantErr: true},
		{in: "", wantErr: true},
	} {
		got, err := ParseAddress(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseAddress(%q) error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if tc.wantErr {
			continue
		}
		if got != tc.want || got.NodeDeviceName() != tc.wantNode {
			t.Errorf("ParseAddress(%q) = %+v (%s); want %+v (%s)", tc.in, got, got.NodeDeviceName(), tc.want, tc.wantNode)
		}
		if again, err := ParseAddress(got.String()); err != nil || again != got {
			t.Errorf("%s does not read back: %+v, %v", got, again, err)
		}
	}
}
