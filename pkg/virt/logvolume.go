package virt

import (
	"context"
	"fmt"
	"strconv"

	"libvirt.org/go/libvirt"
)

// logBackups is how many rotated files virtlogd keeps next to a log
// (its max_backups, 3 by default; a few more in case an operator raised it).
const logBackups = 10

// EnsureLogVolume returns the empty raw volume, mode 0600, that a domain's
// console log goes to, creating it when missing and keeping what an
// existing one holds. Being a pool volume, the log is found and removed
// with its machine on any libvirt host, local or remote.
func (c *Client) EnsureLogVolume(ctx context.Context, pool, name string) (VolumeInfo, error) {
	return c.ensureVolume(ctx, "EnsureLogVolume", pool, name, "log", rawVolumeXML(name, 0, secretMode))
}

// DeleteLogVolume deletes a log volume and the files virtlogd rotated out
// of it (name.0, name.1, …), which the pool learns of only on a refresh;
// a missing volume or pool is success.
func (c *Client) DeleteLogVolume(ctx context.Context, pool, name string) error {
	return c.withConn(ctx, "DeleteLogVolume", func(conn *libvirt.Connect) error {
		return ignoreNotFound(withPool(conn, pool, func(p *libvirt.StoragePool) error {
			if err := refreshPool(ctx, p); err != nil {
				return err
			}
			for i := -1; i < logBackups; i++ {
				n := name
				if i >= 0 {
					n += "." + strconv.Itoa(i)
				}
				if err := deleteVolume(p, n); err != nil {
					return fmt.Errorf("deleting log volume %s/%s: %w", pool, n, err)
				}
			}
			return nil
		}))
	})
}
