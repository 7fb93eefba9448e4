package virt

import (
	"testing"

	"libvirt.org/go/libvirtxml"
)

func TestStorageXMLGolden(t *testing.T) {
	tests := []struct {
		golden string
		doc    marshaler
	}{
		{"pool-dir.xml", poolXML(PoolSpec{Name: "capl-images", Path: "/var/lib/libvirt/capl-images"})},
		{"volume-raw.xml", rawVolumeXML("capl-base-0123456789ab", 157286400, "")},
		{"volume-raw-secret.xml", rawVolumeXML("capl-ns-machine-seed.iso", 65536, secretMode)},
		{"volume-overlay.xml", overlayVolumeXML("capl-ns-machine-disk", 21474836480, "/var/lib/libvirt/capl-images/capl-base-0123456789ab", FormatQCOW2)},
		{"volume-data.xml", qcow2VolumeXML("capl-ns.machine_data-etcd.qcow2", 10737418240)},
		{"volume-overlay-raw-base.xml", overlayVolumeXML("capl-ns-machine-disk", 2147483648, "/pool/base.raw", FormatRaw)},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) { assertGoldenXML(t, tt.golden, tt.doc) })
	}
}

func TestSizeBytes(t *testing.T) {
	if got := sizeBytes(nil); got != 0 {
		t.Errorf("nil: %d", got)
	}
	tests := []struct {
		unit  string
		value uint64
		want  uint64
	}{
		{"bytes", 7, 7},
		{"", 7, 7},
		{"KiB", 2, 2048},
		{"GiB", 2, 2 << 30},
	}
	for _, tt := range tests {
		if got := sizeBytes(&libvirtxml.StorageVolumeSize{Unit: tt.unit, Value: tt.value}); got != tt.want {
			t.Errorf("%d %s = %d bytes, want %d", tt.value, tt.unit, got, tt.want)
		}
	}
}

func TestModeEqual(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"0600", "0600", true},
		{"600", "0600", true},
		{"0644", "0600", false},
		{"", "0600", false},
	}
	for _, tt := range tests {
		if got := modeEqual(tt.a, tt.b); got != tt.want {
			t.Errorf("modeEqual(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}
