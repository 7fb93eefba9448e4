package cloudinit

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
)

func TestBuildISO(t *testing.T) {
	sixtyFourKiB := make([]byte, 64<<10)
	if _, err := rand.Read(sixtyFourKiB); err != nil {
		t.Fatal(err)
	}
	networkConfig := []byte("version: 2\nethernets:\n  id0:\n    match: {macaddress: '52:54:00:12:34:56'}\n    dhcp4: true\n")
	vendorData := []byte("#!/bin/sh\necho vendor\n")

	tests := []struct {
		name          string
		userData      []byte
		networkConfig []byte
		vendorData    []byte
	}{
		{name: "without network-config", userData: []byte("#cloud-config\n")},
		{name: "with network-config", userData: []byte("#cloud-config\n"), networkConfig: networkConfig},
		{name: "with vendor-data", userData: []byte("#cloud-config\n"), vendorData: vendorData},
		{name: "with network-config and vendor-data", userData: []byte("#cloud-config\n"), networkConfig: networkConfig, vendorData: vendorData},
		{name: "64 KiB user-data", userData: sixtyFourKiB, networkConfig: networkConfig, vendorData: vendorData},
		{name: "user-data of exactly one sector", userData: bytes.Repeat([]byte{'x'}, sectorSize)},
		{name: "user-data one byte over a sector", userData: bytes.Repeat([]byte{'y'}, sectorSize+1), networkConfig: networkConfig},
		{name: "vendor-data of exactly one sector", userData: []byte("#cloud-config\n"), vendorData: bytes.Repeat([]byte{'v'}, sectorSize)},
		{name: "empty user-data", userData: nil},
		{name: "empty user-data with vendor-data", userData: nil, vendorData: vendorData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSeed()
			s.UserData, s.NetworkConfig, s.VendorData = tt.userData, tt.networkConfig, tt.vendorData
			metaData, err := s.MetaData()
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]byte{UserDataFile: tt.userData, MetaDataFile: metaData}
			if len(tt.networkConfig) > 0 {
				want[NetworkConfigFile] = tt.networkConfig
			}
			if len(tt.vendorData) > 0 {
				want[VendorDataFile] = tt.vendorData
			}

			image, err := BuildISO(s)
			if err != nil {
				t.Fatalf("BuildISO() error = %v", err)
			}
			if len(image)%sectorSize != 0 {
				t.Errorf("image is %d bytes, not a whole number of sectors", len(image))
			}

			label, files := readImage(t, image)
			if label != VolumeLabel {
				t.Errorf("volume label = %q, want %q", label, VolumeLabel)
			}
			if !slices.Equal(sortedKeys(files), sortedKeys(want)) {
				t.Fatalf("files = %v, want %v", sortedKeys(files), sortedKeys(want))
			}
			for name, content := range want {
				if !bytes.Equal(files[name], content) {
					t.Errorf("%s differs: got %d bytes, want %d bytes", name, len(files[name]), len(content))
				}
			}

			// What kdomanski's reader calls a name is not what the guest sees:
			// check the raw identifiers as Linux's isofs maps them.
			identifiers := rootIdentifiers(t, image)
			if !slices.IsSorted(identifiers) {
				t.Errorf("directory records %q are not sorted as ECMA-119 9.3 requires", identifiers)
			}
			var linuxNames []string
			for _, id := range identifiers {
				linuxNames = append(linuxNames, linuxMappedName(id))
			}
			if !slices.Equal(linuxNames, sortedKeys(want)) {
				t.Errorf("Linux (map=normal) sees %q from identifiers %q, want %q", linuxNames, identifiers, sortedKeys(want))
			}
		})
	}
}

func TestBuildISOIsDeterministic(t *testing.T) {
	withVendorData := func() Seed {
		s := validSeed()
		s.VendorData = []byte("#!/bin/sh\necho vendor\n")
		return s
	}
	for name, seed := range map[string]func() Seed{"without vendor-data": validSeed, "with vendor-data": withVendorData} {
		t.Run(name, func(t *testing.T) {
			first, err := BuildISO(seed())
			if err != nil {
				t.Fatal(err)
			}
			second, err := BuildISO(seed())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, second) {
				t.Error("two builds of the same seed differ")
			}
		})
	}
}

// TestBuildISOWithoutVendorDataUnchanged pins the bytes of a seed without
// vendor-data: the seed service recognises an emptied seed by comparing
// the volume with what BuildISO returns, also for seeds emptied by an
// older release.
func TestBuildISOWithoutVendorDataUnchanged(t *testing.T) {
	image, err := BuildISO(Seed{InstanceID: "0d5b5d3c-3c1e-4b6a-9d5e-6f1f3b8c2a10", LocalHostname: "cp-0"})
	if err != nil {
		t.Fatal(err)
	}
	const want = "eb2477a8f56bd8ee1f518a6785c9703c87deb63b82d83d365d17cad42152b5fa"
	if got := fmt.Sprintf("%x", sha256.Sum256(image)); got != want {
		t.Errorf("sha256 of an emptied seed = %s, was %s before vendor-data existed", got, want)
	}
}

func TestBuildISORejectsInvalidSeed(t *testing.T) {
	s := validSeed()
	s.LocalHostname = "Not A Hostname"
	if image, err := BuildISO(s); err == nil {
		t.Fatalf("BuildISO() = %d bytes, want an error", len(image))
	}
}

// TestBuildISOWithIsoinfo checks the image against a second, independent
// ISO 9660 reader. The fixture holds no real secret, so writing it to the
// test's temporary directory is fine.
func TestBuildISOWithIsoinfo(t *testing.T) {
	isoinfo, err := exec.LookPath("isoinfo")
	if err != nil {
		testprereq.Missing(t, "isoinfo is not installed (apt install genisoimage; hack/prepare-host.sh installs it)")
	}
	s := validSeed()
	s.NetworkConfig = []byte("version: 2\n")
	s.VendorData = []byte("#!/bin/sh\necho vendor\n")
	image, err := BuildISO(s)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := os.WriteFile(path, image, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(isoinfo, append([]string{"-i", path}, args...)...).Output()
		if err != nil {
			t.Fatalf("isoinfo %v: %v", args, err)
		}
		return out
	}

	if info := string(run("-d")); !strings.Contains(info, "Volume id: "+VolumeLabel+"\n") {
		t.Errorf("isoinfo -d does not report label %q:\n%s", VolumeLabel, info)
	}
	listing := string(run("-l"))
	for _, id := range []string{"meta-data;1", "network-config;1", "user-data;1", "vendor-data;1"} {
		if !strings.Contains(listing, " "+id+" ") {
			t.Errorf("isoinfo -l does not list %s:\n%s", id, listing)
		}
	}
	if got := run("-x", "/user-data;1"); !bytes.Equal(got, s.UserData) {
		t.Errorf("isoinfo extracts user-data as %q, want %q", got, s.UserData)
	}
	if got := run("-x", "/vendor-data;1"); !bytes.Equal(got, s.VendorData) {
		t.Errorf("isoinfo extracts vendor-data as %q, want %q", got, s.VendorData)
	}
}

func BenchmarkBuildISO(b *testing.B) {
	s := validSeed()
	s.UserData = bytes.Repeat([]byte("#cloud-config\n"), (64<<10)/len("#cloud-config\n")+1)[:64<<10]
	b.SetBytes(int64(len(s.UserData)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := BuildISO(s); err != nil {
			b.Fatal(err)
		}
	}
}

// readImage reads image back with kdomanski's reader and returns its label
// and its root files by name.
func readImage(t *testing.T, image []byte) (string, map[string][]byte) {
	t.Helper()
	img, err := iso9660.OpenImage(bytes.NewReader(image))
	if err != nil {
		t.Fatalf("OpenImage: %v", err)
	}
	label, err := img.Label()
	if err != nil {
		t.Fatalf("Label: %v", err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatalf("RootDir: %v", err)
	}
	children, err := root.GetChildren()
	if err != nil {
		t.Fatalf("GetChildren: %v", err)
	}
	files := make(map[string][]byte)
	for _, c := range children {
		if c.IsDir() {
			t.Errorf("unexpected directory %s", c.Name())
			continue
		}
		content, err := io.ReadAll(c.Reader())
		if err != nil {
			t.Fatalf("reading %s: %v", c.Name(), err)
		}
		files[c.Name()] = content
	}
	// The label field is space-padded to 32 bytes.
	return strings.TrimRight(label, " "), files
}

// rootIdentifiers returns the raw identifiers of the files in the root
// directory, decoded from the directory records.
func rootIdentifiers(t *testing.T, image []byte) []string {
	t.Helper()
	const rootRecordOffset = primaryDescriptorSector*sectorSize + 156 // ECMA-119 8.4.18
	var root iso9660.DirectoryEntry
	if err := root.UnmarshalBinary(image[rootRecordOffset:]); err != nil {
		t.Fatalf("root directory record: %v", err)
	}
	extent := image[int(root.ExtentLocation)*sectorSize:][:root.ExtentLength]
	var identifiers []string
	for offset := 0; offset < len(extent) && extent[offset] != 0; offset += int(extent[offset]) {
		var record iso9660.DirectoryEntry
		if err := record.UnmarshalBinary(extent[offset:]); err != nil {
			t.Fatalf("directory record at %d: %v", offset, err)
		}
		if record.Identifier != "\x00" && record.Identifier != "\x01" {
			identifiers = append(identifiers, record.Identifier)
		}
	}
	return identifiers
}

// linuxMappedName is the name Linux's isofs shows for an identifier under its
// default map=normal when the volume has neither Rock Ridge nor Joliet:
// lower-case, without a trailing ";1" or ".;1", other ';' becoming '.'
// (isofs_name_translate, fs/isofs/dir.c).
func linuxMappedName(identifier string) string {
	name := strings.ToLower(identifier)
	if base, versioned := strings.CutSuffix(name, ";1"); versioned {
		name = strings.TrimSuffix(base, ".")
	}
	return strings.ReplaceAll(name, ";", ".")
}

func sortedKeys(m map[string][]byte) []string {
	return slices.Sorted(maps.Keys(m))
}
