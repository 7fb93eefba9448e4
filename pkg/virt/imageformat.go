package virt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// imageHeadBytes is how much of an image inspectImage reads: a qcow2
// header and its extensions sit in the first cluster, and no image of a
// sane tool puts its extensions past the first 64 KiB.
const imageHeadBytes = 64 << 10

// qcow2 header fields (big-endian), from QEMU's docs/interop/qcow2.txt.
const (
	qcow2Magic                = 0x514649fb // "QFI\xfb"
	qcow2OffVersion           = 4
	qcow2OffBackingFileOffset = 8
	qcow2OffBackingFileSize   = 16
	qcow2OffIncompatible      = 72
	qcow2OffHeaderLength      = 100
	qcow2V2HeaderLength       = 72
	qcow2V3MinHeaderLength    = 104
	// qcow2IncompatDataFile is the incompatible-feature bit of an image
	// whose guest data lives in an external file named in its header.
	qcow2IncompatDataFile = 1 << 2
	// qcow2ExtDataFile is the header extension naming that file;
	// qcow2ExtEnd ends the extension list.
	qcow2ExtDataFile = 0x44415441
	qcow2ExtEnd      = 0
)

// foreignImageMagics are the signatures of image formats the provider does
// not import: several can name other files by host path (vmdk extents, qed
// and cow backing files), and QEMU or libvirt's pool refresh would follow
// those names if the bytes were ever probed rather than pinned as raw.
var foreignImageMagics = []struct {
	format string
	magic  []byte
}{
	{"vmdk", []byte("KDMV")},
	{"vmdk", []byte("# Disk DescriptorFile")},
	{"qed", []byte("QED\x00")},
	{"cow", []byte("OOOM")},
	{"vhdx", []byte("vhdxfile")},
	{"vpc", []byte("conectix")},
	{"luks", []byte("LUKS\xba\xbe")},
	{"parallels", []byte("WithoutFreeSpace")},
	{"parallels", []byte("WithouFreSpacExt")},
}

// inspectImage decides an image's format from its first bytes (at least
// imageHeadBytes of them, or the whole image when shorter) and refuses
// every image that could make QEMU or libvirt open another file: a qcow2
// with a backing file or an external data file, and formats other than
// qcow2 and raw. Anything without a known signature is raw data.
func inspectImage(head []byte) (string, error) {
	if len(head) >= 4 && binary.BigEndian.Uint32(head) == qcow2Magic {
		if err := inspectQCOW2(head); err != nil {
			return "", err
		}
		return FormatQCOW2, nil
	}
	for _, m := range foreignImageMagics {
		if bytes.HasPrefix(head, m.magic) {
			return "", &ImageRefusedError{Err: ErrImageFormatUnsupported, Detail: fmt.Sprintf("it is a %s image; only raw and qcow2 images are imported", m.format)}
		}
	}
	return FormatRaw, nil
}

// inspectQCOW2 refuses a qcow2 header that names another file or that this
// function cannot read whole.
func inspectQCOW2(h []byte) error {
	refuse := func(err error, format string, args ...any) error {
		return &ImageRefusedError{Err: err, Detail: fmt.Sprintf(format, args...)}
	}
	if len(h) < qcow2V2HeaderLength {
		return refuse(ErrImageFormatUnsupported, "its qcow2 header is cut short (%d bytes)", len(h))
	}
	be := binary.BigEndian
	version := be.Uint32(h[qcow2OffVersion:])
	if version != 2 && version != 3 {
		return refuse(ErrImageFormatUnsupported, "it is qcow version %d; only qcow2 versions 2 and 3 are imported", version)
	}
	if be.Uint64(h[qcow2OffBackingFileOffset:]) != 0 || be.Uint32(h[qcow2OffBackingFileSize:]) != 0 {
		return refuse(ErrImageHasBackingFile, "its qcow2 header names a backing file")
	}
	extStart := uint64(qcow2V2HeaderLength)
	if version == 3 {
		if len(h) < qcow2V3MinHeaderLength {
			return refuse(ErrImageFormatUnsupported, "its qcow2 v3 header is cut short (%d bytes)", len(h))
		}
		if be.Uint64(h[qcow2OffIncompatible:])&qcow2IncompatDataFile != 0 {
			return refuse(ErrImageHasDataFile, "its qcow2 header keeps the guest's data in an external file")
		}
		extStart = uint64(be.Uint32(h[qcow2OffHeaderLength:]))
		if extStart < qcow2V3MinHeaderLength {
			return refuse(ErrImageFormatUnsupported, "its qcow2 header length %d is too short", extStart)
		}
	}
	// An external data file's name is an extension; refused even without
	// the feature bit, which a later writer could set.
	for off := extStart; ; {
		if off+8 > uint64(len(h)) {
			return refuse(ErrImageFormatUnsupported, "its qcow2 header extensions run past the first %d bytes", len(h))
		}
		typ, size := be.Uint32(h[off:]), uint64(be.Uint32(h[off+4:]))
		switch typ {
		case qcow2ExtEnd:
			return nil
		case qcow2ExtDataFile:
			return refuse(ErrImageHasDataFile, "its qcow2 header names an external data file")
		}
		off += 8 + (size+7)&^7
	}
}

// ImageRefusedError details why an image is not imported or not used as
// a base: Err is ErrImageHasBackingFile, ErrImageHasDataFile or
// ErrImageFormatUnsupported.
type ImageRefusedError struct {
	Err    error
	Detail string
}

// Error says what the image is and why it is refused.
func (e *ImageRefusedError) Error() string { return "image refused: " + e.Detail }

// Unwrap makes errors.Is(err, e.Err) and errors.Is(err, ErrImageRefused) true.
func (e *ImageRefusedError) Unwrap() []error { return []error{e.Err, ErrImageRefused} }

// IsImageRefused reports whether err refuses an image for what its bytes are.
func IsImageRefused(err error) bool { return errors.Is(err, ErrImageRefused) }
