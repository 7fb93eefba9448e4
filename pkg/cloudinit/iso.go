package cloudinit

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kdomanski/iso9660"
)

// VolumeLabel is the volume identifier cloud-init's NoCloud data source looks
// for; it accepts "cidata" or "CIDATA".
const VolumeLabel = "cidata"

// Names of the files in the seed, as cloud-init opens them.
const (
	UserDataFile      = "user-data"
	MetaDataFile      = "meta-data"
	NetworkConfigFile = "network-config"
	VendorDataFile    = "vendor-data"
)

// Image layout (ECMA-119): sectors 0-15 are the unused system area, then one
// sector each for the volume descriptors, the two path tables and the root
// directory, then the files.
const (
	sectorSize               = 2048
	primaryDescriptorSector  = 16
	terminatorSector         = 17
	lPathTableSector         = 18
	mPathTableSector         = 19
	rootDirectorySector      = 20
	firstFileSector          = 21
	volumeDescriptorVersion  = 1
	primaryDescriptorType    = 1
	terminatorDescriptorType = 255
	directoryFlag            = 0x02
	// fileVersion is the ";1" suffix ISO 9660 puts on every file identifier,
	// which Linux drops when it maps names.
	fileVersion = ";1"
)

// recordingTime is the timestamp of every directory record. A fixed value
// makes the image a pure function of the Seed.
var recordingTime = iso9660.RecordingTimestamp(time.Unix(0, 0).UTC())

type isoFile struct {
	identifier string
	data       []byte
}

// BuildISO returns the NoCloud seed for s as an ISO 9660 image labelled
// "cidata", holding user-data, meta-data and, each when not empty in s,
// network-config and vendor-data. It validates s first. The image is built
// in memory only, and the same Seed always yields the same bytes.
func BuildISO(s Seed) ([]byte, error) {
	metaData, err := s.MetaData()
	if err != nil {
		return nil, err
	}
	files := []isoFile{
		{identifier: UserDataFile + fileVersion, data: s.UserData},
		{identifier: MetaDataFile + fileVersion, data: metaData},
	}
	if len(s.NetworkConfig) > 0 {
		files = append(files, isoFile{identifier: NetworkConfigFile + fileVersion, data: s.NetworkConfig})
	}
	if len(s.VendorData) > 0 {
		files = append(files, isoFile{identifier: VendorDataFile + fileVersion, data: s.VendorData})
	}
	return buildImage(VolumeLabel, files)
}

// buildImage lays out a volume whose root directory holds files and nothing
// else.
func buildImage(label string, files []isoFile) ([]byte, error) {
	// ECMA-119 9.3 wants directory records sorted by identifier. Plain byte
	// order matches its collation as long as no name is a prefix of another.
	slices.SortFunc(files, func(a, b isoFile) int { return strings.Compare(a.identifier, b.identifier) })

	root := directoryRecord("\x00", rootDirectorySector, sectorSize, directoryFlag)
	parent := directoryRecord("\x01", rootDirectorySector, sectorSize, directoryFlag)
	records := []iso9660.DirectoryEntry{root, parent}
	extents := make([]uint32, len(files))
	nextSector := uint32(firstFileSector)
	for i, f := range files {
		if uint64(len(f.data)) > math.MaxUint32 {
			return nil, fmt.Errorf("%s is %d bytes, more than an ISO 9660 file can hold", f.identifier, len(f.data))
		}
		extents[i] = nextSector
		records = append(records, directoryRecord(f.identifier, nextSector, uint32(len(f.data)), 0))
		nextSector += sectorsFor(len(f.data))
	}

	var directory bytes.Buffer
	for _, r := range records {
		encoded, err := r.MarshalBinary()
		if err != nil {
			return nil, err
		}
		directory.Write(encoded)
	}
	// A record may not straddle sectors and the layout gives the root one.
	if directory.Len() > sectorSize {
		return nil, fmt.Errorf("root directory needs %d bytes, more than one sector", directory.Len())
	}

	pvd := iso9660.PrimaryVolumeDescriptorBody{
		VolumeIdentifier:     label,
		VolumeSpaceSize:      int32(nextSector),
		VolumeSetSize:        1,
		VolumeSequenceNumber: 1,
		LogicalBlockSize:     sectorSize,
		PathTableSize:        pathTableSize,
		TypeLPathTableLoc:    lPathTableSector,
		TypeMPathTableLoc:    mPathTableSector,
		RootDirectoryEntry:   &root,
		FileStructureVersion: 1,
	}
	descriptor, err := pvd.MarshalBinary()
	if err != nil {
		return nil, err
	}

	image := make([]byte, int(nextSector)*sectorSize)
	copy(sector(image, primaryDescriptorSector), descriptor)
	writeDescriptorHeader(sector(image, primaryDescriptorSector), primaryDescriptorType)
	writeDescriptorHeader(sector(image, terminatorSector), terminatorDescriptorType)
	writeRootPathTable(sector(image, lPathTableSector), binary.LittleEndian)
	writeRootPathTable(sector(image, mPathTableSector), binary.BigEndian)
	copy(sector(image, rootDirectorySector), directory.Bytes())
	for i, f := range files {
		copy(image[int(extents[i])*sectorSize:], f.data)
	}
	return image, nil
}

func directoryRecord(identifier string, extent, length uint32, flags byte) iso9660.DirectoryEntry {
	return iso9660.DirectoryEntry{
		ExtentLocation:       int32(extent),
		ExtentLength:         length,
		RecordingDateTime:    recordingTime,
		FileFlags:            flags,
		VolumeSequenceNumber: 1,
		Identifier:           identifier,
	}
}

func sectorsFor(length int) uint32 {
	return uint32((length + sectorSize - 1) / sectorSize)
}

func sector(image []byte, n int) []byte {
	return image[n*sectorSize : (n+1)*sectorSize]
}

// writeDescriptorHeader fills bytes 0-6 of a volume descriptor (ECMA-119 8.1),
// which kdomanski's PrimaryVolumeDescriptorBody leaves to its unexported
// caller.
func writeDescriptorHeader(dst []byte, descriptorType byte) {
	dst[0] = descriptorType
	copy(dst[1:6], "CD001")
	dst[6] = volumeDescriptorVersion
}

// pathTableSize is the size of a path table listing only the root: an 8-byte
// header, its 1-byte identifier and a pad byte to keep records even.
const pathTableSize = 10

// writeRootPathTable writes the path table (ECMA-119 9.4) of a volume whose
// only directory is the root, in the given byte order.
func writeRootPathTable(dst []byte, order binary.ByteOrder) {
	dst[0] = 1 // identifier length
	order.PutUint32(dst[2:6], rootDirectorySector)
	order.PutUint16(dst[6:8], 1) // the root is its own parent, directory number 1
	// dst[8] is the root's identifier, 0x00, and dst[9] padding; both are already zero.
}
