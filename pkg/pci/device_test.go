package pci

import "testing"

func TestParseID(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    uint16
		wantErr bool
	}{
		{in: "10de", want: 0x10de},
		{in: "0x1AF4", want: 0x1af4},
		{in: "a", want: 0xa},
		{in: "", wantErr: true},
		{in: "0x", wantErr: true},
		{in: "10de0", wantErr: true},
		{in: "nvidia", wantErr: true},
		{in: "-1", wantErr: true},
	} {
		got, err := ParseID(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseID(%q) = %#x, %v; want %#x, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	if got := (IDs{Vendor: 0x10de, Device: 0x2204}).String(); got != "10de:2204" {
		t.Errorf("IDs.String() = %s", got)
	}
}

// TestClassKind: disk controllers, NICs and bridges need the operator's
// leave, whatever their subclass; a GPU or an unclassified device does not.
func TestClassKind(t *testing.T) {
	for _, tc := range []struct {
		in        string
		want      Kind
		pciBridge bool
		wantErr   bool
	}{
		{in: "0x010802", want: KindStorage}, // NVMe
		{in: "0x018000", want: KindStorage}, // virtio-blk
		{in: "0x020000", want: KindNetwork}, // Ethernet
		{in: "0x060000", want: KindBridge},  // host bridge
		{in: "0x060400", want: KindBridge, pciBridge: true},
		{in: "0x030000"}, // VGA
		{in: "0x0c0330"}, // USB xHCI
		{in: "0xffff00"}, // unclassified
		{in: "0x1000000", wantErr: true},
		{in: "bridge", wantErr: true},
	} {
		c, err := ParseClass(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseClass(%q) error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if tc.wantErr {
			continue
		}
		if c.Kind() != tc.want || c.IsPCIBridge() != tc.pciBridge || c.String() != tc.in {
			t.Errorf("%s: kind %q, PCI bridge %v, string %s; want %q, %v", tc.in, c.Kind(), c.IsPCIBridge(), c, tc.want, tc.pciBridge)
		}
	}
}
