package virt

import (
	"context"
	"errors"

	"libvirt.org/go/libvirt"
)

// HostMemory returns the libvirt host's total physical memory in bytes.
// The host's RAM does not change while libvirtd runs, so the first
// successful answer is kept; a failed read is retried on the next call.
//
// It asks virNodeGetMemoryStats for all cells (the host's MemTotal) rather
// than virNodeGetInfo: the latter sums the NUMA nodes' memory, which on
// some hosts (paravirtual nested guests) covers only part of the RAM, e.g.
// 13 GiB of 24 GiB, and would refuse machines that run fine. Drivers
// without memory stats (test://) fall back to virNodeGetInfo.
func (c *Client) HostMemory(ctx context.Context) (uint64, error) {
	c.hostMemoryMu.Lock()
	defer c.hostMemoryMu.Unlock()
	if c.hostMemory > 0 {
		return c.hostMemory, nil
	}
	var kib uint64
	err := c.withConn(ctx, "HostMemory", func(conn *libvirt.Connect) error {
		var err error
		kib, err = hostMemoryKiB(conn)
		return err
	})
	if err != nil {
		return 0, err
	}
	if kib == 0 {
		// Caching a zero would make every machine "too large" for good.
		return 0, errors.New("libvirt reports a host without memory")
	}
	c.hostMemory = kib << 10
	return c.hostMemory, nil
}

func hostMemoryKiB(conn *libvirt.Connect) (uint64, error) {
	stats, err := conn.GetMemoryStats(libvirt.NODE_MEMORY_STATS_ALL_CELLS, 0)
	var lerr libvirt.Error
	switch {
	case err == nil && stats.TotalSet && stats.Total > 0:
		return stats.Total, nil
	case err != nil && (!errors.As(err, &lerr) || lerr.Code != libvirt.ERR_NO_SUPPORT):
		return 0, err
	}
	info, err := conn.GetNodeInfo()
	if err != nil {
		return 0, err
	}
	return info.Memory, nil
}
