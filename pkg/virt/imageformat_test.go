package virt

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
		{"qcow2 naming a backing file", qcow2Header(3, 512, 0), "", ErrImageHasBackingFile},
		{"qcow2 v2 naming a backing file", qcow2Header(2, 512, 0), "", ErrImageHasBackingFile},
		{"qcow2 with the external data file bit", qcow2Header(3, 0, qcow2IncompatDataFile), "", ErrImageHasDataFile},
		{"qcow2 naming a data file without the bit", qcow2Header(3, 0, 0, uint32(qcow2ExtDataFile), []byte("/etc/shadow")), "", ErrImageHasDataFile},
		{"qcow version 1", qcow2Header(1, 0, 0), "", ErrImageFormatUnsupported},
		{"qcow2 cut short", qcow2Header(3, 0, 0)[:80], "", ErrImageFormatUnsupported},
		{"qcow2 whose extensions never end", qcow2Header(3, 0, 0)[:qcow2V3MinHeaderLength+4], "", ErrImageFormatUnsupported},
		{"vmdk sparse", append([]byte("KDMV"), make([]byte, 508)...), "", ErrImageFormatUnsupported},
		{"vmdk descriptor", []byte("# Disk DescriptorFile\nRW 8 FLAT \"/etc/shadow\" 0\n"), "", ErrImageFormatUnsupported},
		{"qed", append([]byte("QED\x00"), make([]byte, 60)...), "", ErrImageFormatUnsupported},
		{"raw bytes", []byte("\xeb\x63\x90 a boot sector and then a filesystem"), FormatRaw, nil},
		{"empty", nil, FormatRaw, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			format, err := inspectImage(tt.head)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if err != nil && !IsImageRefused(err) {
				t.Errorf("error %v is not an image refusal", err)
			}
			if format != tt.wantFormat {
				t.Errorf("format %q, want %q", format, tt.wantFormat)
			}
		})
	}
}

// FuzzInspectImage: no header, however made, panics the inspection or
// passes as qcow2 while naming another file.
func FuzzInspectImage(f *testing.F) {
	f.Add(qcow2Header(3, 0, 0))
	f.Add(qcow2Header(3, 0, 0, uint32(0x6803f857), []byte("features")))
	f.Fuzz(func(t *testing.T, head []byte) {
		format, err := inspectImage(head)
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
	})
}
