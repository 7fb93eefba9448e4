package virt

import (
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/diskimage"
)

// Volume formats the engine creates or recognises.
const (
	FormatQCOW2 = diskimage.FormatQCOW2
	FormatRaw   = diskimage.FormatRaw
)

// secretMode is the permission of volumes that hold bootstrap secrets: only
// the owner (QEMU, after libvirt's dynamic ownership chowns it) may read.
const secretMode = "0600"

// poolXML builds a directory pool definition.
func poolXML(spec PoolSpec) *libvirtxml.StoragePool {
	return &libvirtxml.StoragePool{
		Type:   "dir",
		Name:   spec.Name,
		Target: &libvirtxml.StoragePoolTarget{Path: spec.Path},
	}
}

// rawVolumeXML builds a sparse raw volume of exactly capacity bytes, which
// an upload then fills; mode, when set, restricts its file permissions.
func rawVolumeXML(name string, capacity uint64, mode string) *libvirtxml.StorageVolume {
	v := &libvirtxml.StorageVolume{
		Name:       name,
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacity},
		Target: &libvirtxml.StorageVolumeTarget{
			Format: &libvirtxml.StorageVolumeTargetFormat{Type: FormatRaw},
		},
	}
	if mode != "" {
		v.Target.Permissions = &libvirtxml.StorageVolumeTargetPermissions{Mode: mode}
	}
	return v
}

// qcow2VolumeXML builds an empty sparse qcow2 volume (a data disk), compat
// 1.1 because libvirt's pool default (0.10) lacks zero clusters and bloats
// as the guest writes.
func qcow2VolumeXML(name string, capacity uint64) *libvirtxml.StorageVolume {
	return &libvirtxml.StorageVolume{
		Name:       name,
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacity},
		Target: &libvirtxml.StorageVolumeTarget{
			Format: &libvirtxml.StorageVolumeTargetFormat{Type: FormatQCOW2},
			Compat: "1.1",
		},
	}
}

// overlayVolumeXML builds a qcow2 overlay on a base volume. The backing
// format is explicit because libvirt ≥6 refuses to probe it.
func overlayVolumeXML(name string, capacity uint64, backingPath, backingFormat string) *libvirtxml.StorageVolume {
	v := qcow2VolumeXML(name, capacity)
	v.BackingStore = &libvirtxml.StorageVolumeBackingStore{
		Path:   backingPath,
		Format: &libvirtxml.StorageVolumeTargetFormat{Type: backingFormat},
	}
	return v
}
