package virt

import (
	"context"
	"fmt"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// EnsureDataVolume returns the empty qcow2 volume of a machine's data
// disk, created sparse with capacity bytes when missing. One that exists
// is returned as it is: a data disk's size never changes (the spec is
// immutable), and a volume with the guest's data is never recreated.
func (c *Client) EnsureDataVolume(ctx context.Context, pool, name string, capacity uint64) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withConn(ctx, "EnsureDataVolume", func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			err := withVolume(p, name, func(v *libvirt.StorageVol) error {
				var err error
				info, err = describeVolume(pool, v)
				return err
			})
			if !IsNotFound(err) {
				return err
			}
			doc, err := dataVolumeXML(name, capacity).Marshal()
			if err != nil {
				return err
			}
			vol, err := p.StorageVolCreateXML(doc, 0)
			if err != nil {
				return wrapNoSpace(pool, fmt.Errorf("creating data volume %s/%s: %w", pool, name, err))
			}
			defer vol.Free()
			info, err = describeVolume(pool, vol)
			return err
		})
	})
	return info, err
}

// dataVolumeXML builds an empty qcow2 volume of capacity bytes, compat 1.1
// as overlays are (zero clusters: it stays sparse as the guest writes).
func dataVolumeXML(name string, capacity uint64) *libvirtxml.StorageVolume {
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
