// Package diskimage reads what an image's first bytes say before any of
// it reaches a pool: its format (raw or qcow2), whether it would make QEMU
// or libvirt open another file of the host (a backing file, an external
// data file, another format's extents), and how many bytes it may take
// while it still fits the disk asked for. It touches no file and no
// libvirt: the importers of pkg/virt feed it the bytes they stream.
package diskimage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// HeadBytes is how much of an image Inspect reads: a qcow2
// header and its extensions sit in the first cluster, and no image of a
// sane tool puts its extensions past the first 64 KiB.
const HeadBytes = 64 << 10

// The formats Inspect tells apart; anything else is refused.
const (
	FormatQCOW2 = "qcow2"
	FormatRaw   = "raw"
)

// Why an image is refused: errors.Is(err, ErrRefused) for each of the
// first three (a *RefusedError carries the detail); ErrLargerThanDisk is a
// qcow2 describing a disk larger than the one asked for.
var (
	ErrRefused           = errors.New("image refused")
	ErrHasBackingFile    = errors.New("image has a backing file")
	ErrHasDataFile       = errors.New("image has an external data file")
	ErrFormatUnsupported = errors.New("image format not supported")
	ErrLargerThanDisk    = errors.New("base image larger than the disk")
)

// qcow2 header fields (big-endian), from QEMU's docs/interop/qcow2.txt.
const (
	qcow2Magic                = 0x514649fb // "QFI\xfb"
	qcow2OffVersion           = 4
	qcow2OffBackingFileOffset = 8
	qcow2OffBackingFileSize   = 16
	qcow2OffClusterBits       = 20
	qcow2OffSize              = 24
	qcow2OffRefcountOrder     = 96
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

// Inspect decides an image's format from its first bytes (at least
// HeadBytes of them, or the whole image when shorter) and refuses
// every image that could make QEMU or libvirt open another file: a qcow2
// with a backing file or an external data file, and formats other than
// qcow2 and raw. Anything without a known signature is raw data.
func Inspect(head []byte) (string, error) {
	if len(head) >= 4 && binary.BigEndian.Uint32(head) == qcow2Magic {
		if err := inspectQCOW2(head); err != nil {
			return "", err
		}
		return FormatQCOW2, nil
	}
	for _, m := range foreignImageMagics {
		if bytes.HasPrefix(head, m.magic) {
			return "", &RefusedError{Err: ErrFormatUnsupported, Detail: fmt.Sprintf("it is a %s image; only raw and qcow2 images are imported", m.format)}
		}
	}
	return FormatRaw, nil
}

// inspectQCOW2 refuses a qcow2 header that names another file or that this
// function cannot read whole.
func inspectQCOW2(h []byte) error {
	refuse := func(err error, format string, args ...any) error {
		return &RefusedError{Err: err, Detail: fmt.Sprintf(format, args...)}
	}
	if len(h) < qcow2V2HeaderLength {
		return refuse(ErrFormatUnsupported, "its qcow2 header is cut short (%d bytes)", len(h))
	}
	be := binary.BigEndian
	version := be.Uint32(h[qcow2OffVersion:])
	if version != 2 && version != 3 {
		return refuse(ErrFormatUnsupported, "it is qcow version %d; only qcow2 versions 2 and 3 are imported", version)
	}
	if be.Uint64(h[qcow2OffBackingFileOffset:]) != 0 || be.Uint32(h[qcow2OffBackingFileSize:]) != 0 {
		return refuse(ErrHasBackingFile, "its qcow2 header names a backing file")
	}
	extStart := uint64(qcow2V2HeaderLength)
	if version == 3 {
		if len(h) < qcow2V3MinHeaderLength {
			return refuse(ErrFormatUnsupported, "its qcow2 v3 header is cut short (%d bytes)", len(h))
		}
		if be.Uint64(h[qcow2OffIncompatible:])&qcow2IncompatDataFile != 0 {
			return refuse(ErrHasDataFile, "its qcow2 header keeps the guest's data in an external file")
		}
		extStart = uint64(be.Uint32(h[qcow2OffHeaderLength:]))
		if extStart < qcow2V3MinHeaderLength {
			return refuse(ErrFormatUnsupported, "its qcow2 header length %d is too short", extStart)
		}
	}
	// An external data file's name is an extension; refused even without
	// the feature bit, which a later writer could set.
	for off := extStart; ; {
		if off+8 > uint64(len(h)) {
			return refuse(ErrFormatUnsupported, "its qcow2 header extensions run past the first %d bytes", len(h))
		}
		typ, size := be.Uint32(h[off:]), uint64(be.Uint32(h[off+4:]))
		switch typ {
		case qcow2ExtEnd:
			return nil
		case qcow2ExtDataFile:
			return refuse(ErrHasDataFile, "its qcow2 header names an external data file")
		}
		off += 8 + (size+7)&^7
	}
}

// qcow2 limits QEMU enforces: clusters of 512 B to 2 MiB, refcounts of at
// most 64 bits (order 6); v2 images have 16-bit refcounts (order 4).
const (
	qcow2MinClusterBits     = 9
	qcow2MaxClusterBits     = 21
	qcow2MaxRefcountOrder   = 6
	qcow2V2RefcountOrder    = 4
	qcow2SlackClusters      = 64
	qcow2ExtendedL2EntryLen = 16
)

// StreamBound is the most bytes an image of format whose first bytes
// are head can take while it still fits a disk of diskBytes: a raw image
// is the disk; a qcow2 is refused when its header's virtual size exceeds
// the disk (ErrLargerThanDisk) and otherwise bounded by what its
// virtual size and cluster size allow (qcow2MaxFileBytes). head passed
// Inspect.
func StreamBound(format string, head []byte, diskBytes uint64) (int64, error) {
	if format != FormatQCOW2 {
		return clampInt64(diskBytes), nil
	}
	be := binary.BigEndian
	virtual := be.Uint64(head[qcow2OffSize:])
	if virtual > diskBytes {
		return 0, fmt.Errorf("%w: its qcow2 header describes a disk of %d bytes, the machine's disk is %d", ErrLargerThanDisk, virtual, diskBytes)
	}
	bits := be.Uint32(head[qcow2OffClusterBits:])
	if bits < qcow2MinClusterBits || bits > qcow2MaxClusterBits {
		return 0, &RefusedError{Err: ErrFormatUnsupported, Detail: fmt.Sprintf("its qcow2 cluster size 2^%d is outside 2^%d..2^%d", bits, qcow2MinClusterBits, qcow2MaxClusterBits)}
	}
	order := uint32(qcow2V2RefcountOrder)
	if be.Uint32(head[qcow2OffVersion:]) == 3 {
		order = be.Uint32(head[qcow2OffRefcountOrder:])
	}
	if order > qcow2MaxRefcountOrder {
		return 0, &RefusedError{Err: ErrFormatUnsupported, Detail: fmt.Sprintf("its qcow2 refcount order %d is above %d", order, qcow2MaxRefcountOrder)}
	}
	return clampInt64(qcow2MaxFileBytes(virtual, uint(bits), uint(order))), nil
}

// qcow2MaxFileBytes bounds the file of a qcow2 image without internal
// snapshots: every guest cluster allocated, its L2 tables (counted with
// extended 16-byte entries, the larger kind), the L1 table, the refcount
// blocks and table that cover all of these (counted at half a block each,
// for the blocks covering themselves), plus qcow2SlackClusters for the
// header, its extensions and what a converter leaves unused.
func qcow2MaxFileBytes(virtual uint64, clusterBits, refcountOrder uint) uint64 {
	cluster := uint64(1) << clusterBits
	data := ceilDiv(virtual, cluster)
	l2 := ceilDiv(data*qcow2ExtendedL2EntryLen, cluster)
	l1 := ceilDiv(l2*8, cluster)
	counted := data + l2 + l1 + qcow2SlackClusters
	perBlock := cluster * 8 >> refcountOrder
	blocks := ceilDiv(counted, perBlock/2)
	table := ceilDiv(blocks*8, cluster)
	total := counted + blocks + table
	if total > math.MaxUint64>>clusterBits {
		return math.MaxUint64 // a virtual size near 2^64: no bound to keep
	}
	return total * cluster
}

func ceilDiv(a, b uint64) uint64 { return a/b + min(a%b, 1) }

// clampInt64 is n, or the largest int64 when n is larger.
func clampInt64(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// RefusedError details why an image is not imported or not used as
// a base: Err is ErrHasBackingFile, ErrHasDataFile or
// ErrFormatUnsupported.
type RefusedError struct {
	Err    error
	Detail string
}

// Error says what the image is and why it is refused.
func (e *RefusedError) Error() string { return "image refused: " + e.Detail }

// Unwrap makes errors.Is(err, e.Err) and errors.Is(err, ErrRefused) true.
func (e *RefusedError) Unwrap() []error { return []error{e.Err, ErrRefused} }

// IsRefused reports whether err refuses an image for what its bytes are.
func IsRefused(err error) bool { return errors.Is(err, ErrRefused) }
