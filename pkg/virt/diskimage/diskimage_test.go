package diskimage

import (
	"encoding/binary"
	"errors"
	"testing"
)

// qcow2Header builds a qcow2 header of version with the given backing-file
// offset, incompatible features and header extensions (type, payload).
func qcow2Header(version uint32, backingOffset, incompatible uint64, exts ...any) []byte {
	length := uint32(qcow2V2HeaderLength)
	if version == 3 {
		length = qcow2V3MinHeaderLength
	}
	h := make([]byte, length)
	be := binary.BigEndian
	be.PutUint32(h, qcow2Magic)
	be.PutUint32(h[qcow2OffVersion:], version)
	be.PutUint64(h[qcow2OffBackingFileOffset:], backingOffset)
	be.PutUint32(h[20:], 16) // cluster bits
	be.PutUint64(h[24:], 1<<30)
	if version == 3 {
		be.PutUint64(h[qcow2OffIncompatible:], incompatible)
		be.PutUint32(h[qcow2OffHeaderLength:], length)
	}
	for i := 0; i+1 < len(exts); i += 2 {
		payload := exts[i+1].([]byte)
		ext := make([]byte, 8+(len(payload)+7)&^7)
		be.PutUint32(ext, exts[i].(uint32))
		be.PutUint32(ext[4:], uint32(len(payload)))
		copy(ext[8:], payload)
		h = append(h, ext...)
	}
	h = append(h, make([]byte, 8)...) // end of extensions
	return append(h, make([]byte, 512)...)
}

func TestInspectImage(t *testing.T) {
	const backingFormatExt = 0xe2792aca
	tests := []struct {
		name       string
		head       []byte
		wantFormat string
		wantErr    error
	}{
		{"qcow2 v3", qcow2Header(3, 0, 0), FormatQCOW2, nil},
		{"qcow2 v2", qcow2Header(2, 0, 0), FormatQCOW2, nil},
		{"qcow2 v3 with a harmless extension", qcow2Header(3, 0, 0, uint32(backingFormatExt), []byte("raw")), FormatQCOW2, nil},
		{"qcow2 naming a backing file", qcow2Header(3, 512, 0), "", ErrHasBackingFile},
		{"qcow2 v2 naming a backing file", qcow2Header(2, 512, 0), "", ErrHasBackingFile},
		{"qcow2 with the external data file bit", qcow2Header(3, 0, qcow2IncompatDataFile), "", ErrHasDataFile},
		{"qcow2 naming a data file without the bit", qcow2Header(3, 0, 0, uint32(qcow2ExtDataFile), []byte("/etc/shadow")), "", ErrHasDataFile},
		{"qcow version 1", qcow2Header(1, 0, 0), "", ErrFormatUnsupported},
		{"qcow2 cut short", qcow2Header(3, 0, 0)[:80], "", ErrFormatUnsupported},
		{"qcow2 whose extensions never end", qcow2Header(3, 0, 0)[:qcow2V3MinHeaderLength+4], "", ErrFormatUnsupported},
		{"vmdk sparse", append([]byte("KDMV"), make([]byte, 508)...), "", ErrFormatUnsupported},
		{"vmdk descriptor", []byte("# Disk DescriptorFile\nRW 8 FLAT \"/etc/shadow\" 0\n"), "", ErrFormatUnsupported},
		{"qed", append([]byte("QED\x00"), make([]byte, 60)...), "", ErrFormatUnsupported},
		{"raw bytes", []byte("\xeb\x63\x90 a boot sector and then a filesystem"), FormatRaw, nil},
		{"empty", nil, FormatRaw, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			format, err := Inspect(tt.head)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if err != nil && !IsRefused(err) {
				t.Errorf("error %v is not an image refusal", err)
			}
			if format != tt.wantFormat {
				t.Errorf("format %q, want %q", format, tt.wantFormat)
			}
		})
	}
}

// FuzzInspect: no header, however made, panics the inspection or
// its stream bound, passes as qcow2 while naming another file, or passes
// the bound while describing a disk larger than the machine's.
func FuzzInspect(f *testing.F) {
	f.Add(qcow2Header(3, 0, 0))
	f.Add(qcow2Header(3, 0, 0, uint32(0x6803f857), []byte("features")))
	f.Fuzz(func(t *testing.T, head []byte) {
		format, err := Inspect(head)
		if err != nil || format != FormatQCOW2 {
			return
		}
		be := binary.BigEndian
		if be.Uint64(head[qcow2OffBackingFileOffset:]) != 0 {
			t.Fatal("a qcow2 with a backing file offset passed")
		}
		if be.Uint32(head[qcow2OffVersion:]) == 3 && be.Uint64(head[qcow2OffIncompatible:])&qcow2IncompatDataFile != 0 {
			t.Fatal("a qcow2 with an external data file passed")
		}
		// Whatever the header's geometry, the stream bound neither panics
		// nor lets a qcow2 larger than the disk through.
		const disk = 1 << 40
		if bound, err := StreamBound(format, head, disk); err == nil &&
			(be.Uint64(head[qcow2OffSize:]) > disk || bound <= 0) {
			t.Fatalf("bound %d for a qcow2 of %d bytes on a %d-byte disk", bound, be.Uint64(head[qcow2OffSize:]), disk)
		}
	})
}

// withGeometry sets a qcow2 header's cluster bits and, for version 3, its
// refcount order.
func withGeometry(h []byte, clusterBits, refcountOrder uint32) []byte {
	h = append([]byte(nil), h...)
	binary.BigEndian.PutUint32(h[qcow2OffClusterBits:], clusterBits)
	if binary.BigEndian.Uint32(h[qcow2OffVersion:]) == 3 {
		binary.BigEndian.PutUint32(h[qcow2OffRefcountOrder:], refcountOrder)
	}
	return h
}

// TestImageStreamBound: a raw image is bounded by the disk; a qcow2 by what
// its virtual size allows, which covers the files qemu-img convert wrote
// from 64 MiB of random data (sizes measured with QEMU 7.2) and stays
// within a few percent plus qcow2SlackClusters of the virtual size; a
// qcow2 describing a larger disk or an impossible geometry is refused.
func TestImageStreamBound(t *testing.T) {
	const disk = 2 << 30
	v64 := func(h []byte) []byte {
		binary.BigEndian.PutUint64(h[qcow2OffSize:], 64<<20)
		return h
	}
	tests := []struct {
		name    string
		format  string
		head    []byte
		atLeast uint64 // a real image of this geometry
		wantErr error
	}{
		{"raw is the disk", FormatRaw, nil, disk, nil},
		{"qcow2 64 KiB clusters", FormatQCOW2, v64(qcow2Header(3, 0, 0)), 67436544, nil},
		{"qcow2 512 B clusters", FormatQCOW2, v64(withGeometry(qcow2Header(3, 0, 0), 9, 4)), 68478976, nil},
		{"qcow2 512 B clusters, 64-bit refcounts", FormatQCOW2, v64(withGeometry(qcow2Header(3, 0, 0), 9, 6)), 69421056, nil},
		{"qcow2 2 MiB clusters", FormatQCOW2, v64(withGeometry(qcow2Header(3, 0, 0), 21, 4)), 77594624, nil},
		{"qcow2 v2", FormatQCOW2, v64(qcow2Header(2, 0, 0)), 67436544, nil},
		{"qcow2 larger than the disk", FormatQCOW2, withGeometry(qcow2Header(3, 0, 0), 16, 4), 0, nil},
		{"qcow2 with 256 B clusters", FormatQCOW2, v64(withGeometry(qcow2Header(3, 0, 0), 8, 4)), 0, ErrFormatUnsupported},
		{"qcow2 with 4 MiB clusters", FormatQCOW2, v64(withGeometry(qcow2Header(3, 0, 0), 22, 4)), 0, ErrFormatUnsupported},
		{"qcow2 with 128-bit refcounts", FormatQCOW2, v64(withGeometry(qcow2Header(3, 0, 0), 16, 7)), 0, ErrFormatUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diskBytes := uint64(disk)
			if tt.name == "qcow2 larger than the disk" {
				diskBytes = 1<<30 - 1
				tt.wantErr = ErrLargerThanDisk
			}
			got, err := StreamBound(tt.format, tt.head, diskBytes)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if uint64(got) < tt.atLeast {
				t.Errorf("bound %d is below a real image's %d bytes", got, tt.atLeast)
			}
			if tt.format == FormatQCOW2 {
				cluster := uint64(1) << binary.BigEndian.Uint32(tt.head[qcow2OffClusterBits:])
				if most := (64<<20)*11/10 + 2*qcow2SlackClusters*cluster; uint64(got) > most {
					t.Errorf("bound %d is above %d: it lets a stream run far past the disk", got, most)
				}
			}
		})
	}
}
