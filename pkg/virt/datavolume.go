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
	return c.ensureVolume(ctx, "EnsureDataVolume", pool, name, "data", qcow2VolumeXML(name, capacity))
}

// ensureVolume describes the volume name of pool, creating it from doc
// when missing; what describes it says which kind of volume it is.
func (c *Client) ensureVolume(ctx context.Context, op, pool, name, what string, doc *libvirtxml.StorageVolume) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withConn(ctx, op, func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			err := withVolume(p, name, func(v *libvirt.StorageVol) error {
				var err error
				info, err = describeVolume(pool, v)
				return err
			})
			if !IsNotFound(err) {
				return err
			}
			xml, err := doc.Marshal()
			if err != nil {
				return err
			}
			vol, err := p.StorageVolCreateXML(xml, 0)
			if err != nil {
				return wrapNoSpace(pool, fmt.Errorf("creating %s volume %s/%s: %w", what, pool, name, err))
			}
			defer vol.Free()
			info, err = describeVolume(pool, vol)
			return err
		})
	})
	return info, err
}
