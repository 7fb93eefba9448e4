package virt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// PoolSpec describes a directory storage pool.
type PoolSpec struct {
	// Name of the libvirt pool.
	Name string
	// Path is the directory on the libvirt host (not the controller's).
	Path string
}

// lockPool serialises the operations on one pool that libvirt refuses to
// run concurrently ("pool has asynchronous jobs running"). A channel rather
// than a mutex, so waiting behind a long import honours ctx.
func (c *Client) lockPool(ctx context.Context, pool string) (func(), error) {
	l := c.poolLock(pool)
	select {
	case l <- struct{}{}:
		return func() { <-l }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for pool %s: %w", pool, ctx.Err())
	}
}

// poolLock is the one-slot semaphore of pool.
func (c *Client) poolLock(pool string) chan struct{} {
	c.poolMu.Lock()
	defer c.poolMu.Unlock()
	l, ok := c.poolLocks[pool]
	if !ok {
		l = make(chan struct{}, 1)
		c.poolLocks[pool] = l
	}
	return l
}

// tryLockPool takes the pool's lock when it is free.
func (c *Client) tryLockPool(pool string) (func(), bool) {
	l := c.poolLock(pool)
	select {
	case l <- struct{}{}:
		return func() { <-l }, true
	default:
		return nil, false
	}
}

// poolServes tells whether spec's pool exists, is active and has spec's path.
func (c *Client) poolServes(ctx context.Context, spec PoolSpec) bool {
	err := c.withConn(ctx, "EnsurePool", func(conn *libvirt.Connect) error {
		return withPool(conn, spec.Name, func(p *libvirt.StoragePool) error {
			if active, err := p.IsActive(); err != nil || !active {
				return errors.Join(err, errors.New("inactive"))
			}
			return checkPoolPath(p, spec)
		})
	})
	return err == nil
}

// EnsurePool defines, builds, starts and autostarts a directory pool and
// refreshes it. A pool of that name with another path is an error rather
// than silently used. If this call defined the pool and cannot start it,
// the definition is removed again.
func (c *Client) EnsurePool(ctx context.Context, spec PoolSpec) error {
	if spec.Name == "" || !filepath.IsAbs(spec.Path) {
		return fmt.Errorf("pool needs a name and an absolute path, got %q %q", spec.Name, spec.Path)
	}
	unlock, ok := c.tryLockPool(spec.Name)
	if !ok {
		// An import holds the pool for as long as its upload runs. A pool
		// that exists, serves and is the one asked for needs nothing from
		// this call but the refresh, which the import does when it ends:
		// do not wait for it.
		if c.poolServes(ctx, spec) {
			return nil
		}
		var err error
		if unlock, err = c.lockPool(ctx, spec.Name); err != nil {
			return err
		}
	}
	defer unlock()
	return c.withConn(ctx, "EnsurePool", func(conn *libvirt.Connect) error {
		pool, err := conn.LookupStoragePoolByName(spec.Name)
		defined := false
		switch {
		case IsNotFound(err):
			doc, merr := poolXML(spec).Marshal()
			if merr != nil {
				return merr
			}
			pool, err = conn.StoragePoolDefineXML(doc, 0)
			if err != nil {
				return fmt.Errorf("defining pool %s: %w", spec.Name, err)
			}
			defined = true
		case err != nil:
			return err
		}
		defer pool.Free()
		if !defined {
			if err := checkPoolPath(pool, spec); err != nil {
				return err
			}
		}
		if err := activatePool(ctx, pool); err != nil {
			if defined {
				_ = pool.Undefine()
			}
			return fmt.Errorf("starting pool %s: %w", spec.Name, err)
		}
		return nil
	})
}

func checkPoolPath(pool *libvirt.StoragePool, spec PoolSpec) error {
	px, err := decodeXML[libvirtxml.StoragePool](pool.GetXMLDesc(libvirt.STORAGE_XML_INACTIVE))
	if err != nil {
		return err
	}
	if px.Type != "dir" || px.Target == nil || filepath.Clean(px.Target.Path) != filepath.Clean(spec.Path) {
		return fmt.Errorf("pool %s exists as a %s pool at %v, not a dir pool at %s", spec.Name, px.Type, px.Target, spec.Path)
	}
	return nil
}

// activatePool builds (creates the directory), starts, autostarts and
// refreshes a defined pool; each step is skipped when already done.
func activatePool(ctx context.Context, pool *libvirt.StoragePool) error {
	active, err := pool.IsActive()
	if err != nil {
		return err
	}
	if !active {
		if err := pool.Build(0); err != nil {
			return fmt.Errorf("building: %w", err)
		}
		if err := pool.Create(0); err != nil {
			return err
		}
	}
	if auto, err := pool.GetAutostart(); err != nil || !auto {
		if err := pool.SetAutostart(true); err != nil {
			return fmt.Errorf("autostart: %w", err)
		}
	}
	if active {
		return refreshPool(ctx, pool)
	}
	return nil // Create just scanned the directory.
}

// refreshPool rescans the pool. Refresh fails while libvirt builds or
// clones a volume in it, possibly for another client, so it is retried.
func refreshPool(ctx context.Context, pool *libvirt.StoragePool) error {
	delay := 50 * time.Millisecond
	for i := 0; ; i++ {
		err := pool.Refresh(0)
		var lerr libvirt.Error
		if err == nil || i == 20 || !errors.As(err, &lerr) || !strings.Contains(lerr.Message, "asynchronous jobs running") {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// withPool looks up a pool and frees it after fn.
func withPool(conn *libvirt.Connect, name string, fn func(*libvirt.StoragePool) error) error {
	pool, err := conn.LookupStoragePoolByName(name)
	return use(pool, err, "pool "+name, fn)
}

// ErrPoolNotEmpty is returned by DeletePool for a pool that still holds
// volumes: they may belong to clusters the caller does not know of.
var ErrPoolNotEmpty = errors.New("storage pool is not empty")

// DeletePool stops, removes the directory of and undefines an empty pool.
// A missing pool is success; a pool holding any volume (after a refresh,
// so files copied in by hand count) is left alone with ErrPoolNotEmpty.
func (c *Client) DeletePool(ctx context.Context, name string) error {
	unlock, err := c.lockPool(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	return c.withConn(ctx, "DeletePool", func(conn *libvirt.Connect) error {
		pool, err := conn.LookupStoragePoolByName(name)
		if IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		defer pool.Free()
		active, err := pool.IsActive()
		if err != nil {
			return err
		}
		if active {
			if err := refreshPool(ctx, pool); err != nil {
				return err
			}
			n, err := pool.NumOfStorageVolumes()
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%w: %s holds %d volumes", ErrPoolNotEmpty, name, n)
			}
			if err := pool.Destroy(); err != nil {
				return fmt.Errorf("stopping pool %s: %w", name, err)
			}
		}
		// Delete removes the (empty) directory; it fails on one that holds
		// files libvirt does not list, and the pool then stays.
		if err := pool.Delete(libvirt.STORAGE_POOL_DELETE_NORMAL); err != nil {
			if active {
				_ = pool.Create(0) // leave it serving as it was found
			}
			return fmt.Errorf("removing the directory of pool %s: %w", name, err)
		}
		return pool.Undefine()
	})
}
