package virt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
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

// ImageImport describes a base image to bring into a pool.
type ImageImport struct {
	// Pool receives the volume; it must exist (EnsurePool).
	Pool string
	// Volume is the final volume name; the caller gives it NamePrefix.
	Volume string
	// Source is a path readable by the controller process or an http(s)
	// URL. It is streamed through libvirt, so the libvirt host may be remote.
	Source string
	// SHA256 is the expected hex digest of Source's bytes.
	SHA256 string
	// Fetch bounds an http(s) download; a zero field sets no bound. The
	// caller's context bounds the whole import.
	Fetch FetchLimits
	// Progress, when set, is called as the source is read, with the bytes
	// read so far and the source's length.
	Progress func(done, total int64)
}

// FetchLimits bound the phases of an image download, so that a server that
// stops answering fails the import rather than holding it forever.
type FetchLimits struct {
	// ConnectTimeout bounds the TCP (and TLS) connection.
	ConnectTimeout time.Duration
	// HeaderTimeout bounds the wait for the response headers once the
	// request was sent.
	HeaderTimeout time.Duration
	// IdleTimeout bounds any wait for the next bytes of the body.
	IdleTimeout time.Duration
}

// OverlaySpec describes a copy-on-write disk on a base volume.
type OverlaySpec struct {
	// Pool and Name place the overlay volume.
	Pool string
	Name string
	// BackingPool and BackingVolume name the base image volume.
	BackingPool   string
	BackingVolume string
	// CapacityBytes is the requested virtual size; the overlay is never
	// smaller than its base.
	CapacityBytes uint64
}

// VolumeInfo describes a storage volume.
type VolumeInfo struct {
	Pool string
	Name string
	// Path is the volume's path on the libvirt host, used in domain XML.
	Path            string
	CapacityBytes   uint64
	AllocationBytes uint64
	// Format is the volume's format type, e.g. "qcow2" or "raw".
	Format string
}

// partialSuffix names the marker volume that exists while an import into
// the volume without the suffix is incomplete.
const partialSuffix = ".partial"

// uploadChunk is the stream chunk size: libvirt's per-message overhead made
// small chunks 100× slower (a 29 MB upload took 95 s with small chunks).
const uploadChunk = 1 << 20

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

// use runs fn on a freshly looked-up libvirt object and frees it after;
// a lookup error is returned naming what was looked up.
func use[P interface{ Free() error }](obj P, err error, what string, fn func(P) error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer obj.Free()
	return fn(obj)
}

// decodeXML parses the XML description a libvirt getter returned into a
// libvirtxml document.
func decodeXML[T any, P interface {
	*T
	Unmarshal(string) error
}](doc string, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	v := P(new(T))
	if err := v.Unmarshal(doc); err != nil {
		return nil, err
	}
	return v, nil
}

// withPool looks up a pool and frees it after fn.
func withPool(conn *libvirt.Connect, name string, fn func(*libvirt.StoragePool) error) error {
	pool, err := conn.LookupStoragePoolByName(name)
	return use(pool, err, "pool "+name, fn)
}

// withVolume looks up a volume and frees it after fn.
func withVolume(pool *libvirt.StoragePool, name string, fn func(*libvirt.StorageVol) error) error {
	vol, err := pool.LookupStorageVolByName(name)
	return use(vol, err, "volume "+name, fn)
}

// volumeExists tells whether pool holds a volume called name.
func volumeExists(pool *libvirt.StoragePool, name string) (bool, error) {
	err := withVolume(pool, name, func(*libvirt.StorageVol) error { return nil })
	if IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// deleteVolume deletes a volume; missing is success.
func deleteVolume(pool *libvirt.StoragePool, name string) error {
	return ignoreNotFound(withVolume(pool, name, func(v *libvirt.StorageVol) error { return v.Delete(0) }))
}

// describeVolume reads a volume's path, sizes and format from its XML.
func describeVolume(poolName string, vol *libvirt.StorageVol) (VolumeInfo, error) {
	vx, err := decodeXML[libvirtxml.StorageVolume](vol.GetXMLDesc(0))
	if err != nil {
		return VolumeInfo{}, err
	}
	info := VolumeInfo{Pool: poolName, Name: vx.Name}
	if vx.Target != nil {
		info.Path = vx.Target.Path
		if vx.Target.Format != nil {
			info.Format = vx.Target.Format.Type
		}
	}
	info.CapacityBytes = sizeBytes(vx.Capacity)
	info.AllocationBytes = sizeBytes(vx.Allocation)
	return info, nil
}

// sizeBytes converts a libvirt size; libvirt reports volumes in bytes, but
// a unit is honoured in case a driver does not.
func sizeBytes(s *libvirtxml.StorageVolumeSize) uint64 {
	if s == nil {
		return 0
	}
	mult := map[string]uint64{"": 1, "b": 1, "bytes": 1, "KiB": 1 << 10, "k": 1 << 10, "MiB": 1 << 20, "M": 1 << 20,
		"GiB": 1 << 30, "G": 1 << 30, "TiB": 1 << 40, "T": 1 << 40}[s.Unit]
	if mult == 0 {
		mult = 1
	}
	return s.Value * mult
}

// VolumeInfo describes a volume; IsNotFound(err) when it or its pool does
// not exist.
func (c *Client) VolumeInfo(ctx context.Context, pool, name string) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withConn(ctx, "VolumeInfo", func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			return withVolume(p, name, func(v *libvirt.StorageVol) error {
				var err error
				info, err = describeVolume(pool, v)
				return err
			})
		})
	})
	return info, err
}

// DeleteVolume deletes a volume together with an import marker it may
// have; a missing pool or volume is success.
func (c *Client) DeleteVolume(ctx context.Context, pool, name string) error {
	return c.withConn(ctx, "DeleteVolume", func(conn *libvirt.Connect) error {
		return ignoreNotFound(withPool(conn, pool, func(p *libvirt.StoragePool) error {
			if err := deleteVolume(p, name); err != nil {
				return fmt.Errorf("deleting volume %s/%s: %w", pool, name, err)
			}
			return deleteVolume(p, name+partialSuffix)
		}))
	})
}

// EnsureOverlay creates a qcow2 overlay backed by a base volume, with
// capacity max(requested, base virtual size). An existing overlay is
// reused and grown when a larger capacity is requested, never shrunk.
// ErrImageNotFound when the base is missing or its import is incomplete.
func (c *Client) EnsureOverlay(ctx context.Context, spec OverlaySpec) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withConn(ctx, "EnsureOverlay", func(conn *libvirt.Connect) error {
		var base VolumeInfo
		err := withPool(conn, spec.BackingPool, func(bp *libvirt.StoragePool) error {
			if partial, err := volumeExists(bp, spec.BackingVolume+partialSuffix); err != nil || partial {
				return errors.Join(err, fmt.Errorf("%w: import of %s/%s is incomplete", ErrImageNotFound, spec.BackingPool, spec.BackingVolume))
			}
			return withVolume(bp, spec.BackingVolume, func(v *libvirt.StorageVol) error {
				var err error
				base, err = describeVolume(spec.BackingPool, v)
				return err
			})
		})
		if IsNotFound(err) {
			return fmt.Errorf("%w: base %s/%s: %v", ErrImageNotFound, spec.BackingPool, spec.BackingVolume, err)
		}
		if err != nil {
			return err
		}
		capacity := max(spec.CapacityBytes, base.CapacityBytes)
		return withPool(conn, spec.Pool, func(p *libvirt.StoragePool) error {
			info, err = ensureOverlayIn(p, spec, base, capacity)
			return wrapNoSpace(spec.Pool, err)
		})
	})
	return info, err
}

func ensureOverlayIn(p *libvirt.StoragePool, spec OverlaySpec, base VolumeInfo, capacity uint64) (VolumeInfo, error) {
	vol, err := p.LookupStorageVolByName(spec.Name)
	if IsNotFound(err) {
		doc, merr := overlayVolumeXML(spec.Name, capacity, base.Path, base.Format).Marshal()
		if merr != nil {
			return VolumeInfo{}, merr
		}
		vol, err = p.StorageVolCreateXML(doc, 0)
		if err != nil {
			return VolumeInfo{}, fmt.Errorf("creating overlay %s/%s: %w", spec.Pool, spec.Name, err)
		}
	} else if err != nil {
		return VolumeInfo{}, err
	}
	defer vol.Free()
	info, err := describeVolume(spec.Pool, vol)
	if err != nil || info.CapacityBytes >= capacity {
		return info, err
	}
	if err := vol.Resize(capacity, 0); err != nil {
		return VolumeInfo{}, fmt.Errorf("growing overlay %s/%s to %d bytes: %w", spec.Pool, spec.Name, capacity, err)
	}
	return describeVolume(spec.Pool, vol)
}

// UploadVolume writes data into a raw volume with mode 0600, creating it
// when missing and recreating it when its size or mode differ. The content
// is uploaded on every call: for the small seed ISOs this is as cheap as
// downloading to compare, and it repairs a volume whose previous upload
// was cut short by a crash.
func (c *Client) UploadVolume(ctx context.Context, pool, name string, data []byte) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withConn(ctx, "UploadVolume", func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			vol, err := ensureRawVolume(p, name, uint64(len(data)), secretMode)
			if err != nil {
				return wrapNoSpace(pool, err)
			}
			defer vol.Free()
			if err := upload(ctx, conn, p, vol, bytes.NewReader(data), int64(len(data)), nil); err != nil {
				return wrapNoSpace(pool, fmt.Errorf("uploading %s/%s: %w", pool, name, err))
			}
			info, err = describeVolume(pool, vol)
			return err
		})
	})
	return info, err
}

// ensureRawVolume returns a raw volume of exactly size bytes and the given
// mode, replacing an existing one that differs.
func ensureRawVolume(p *libvirt.StoragePool, name string, size uint64, mode string) (*libvirt.StorageVol, error) {
	vol, err := p.LookupStorageVolByName(name)
	if err == nil {
		ok, cerr := rawVolumeMatches(vol, size, mode)
		if cerr != nil {
			vol.Free()
			return nil, cerr
		}
		if ok {
			return vol, nil
		}
		err = vol.Delete(0)
		vol.Free()
		if err != nil {
			return nil, fmt.Errorf("replacing volume %s: %w", name, err)
		}
	} else if !IsNotFound(err) {
		return nil, err
	}
	doc, err := rawVolumeXML(name, size, mode).Marshal()
	if err != nil {
		return nil, err
	}
	vol, err = p.StorageVolCreateXML(doc, 0)
	if err != nil {
		return nil, fmt.Errorf("creating volume %s: %w", name, err)
	}
	return vol, nil
}

func rawVolumeMatches(vol *libvirt.StorageVol, size uint64, mode string) (bool, error) {
	vx, err := decodeXML[libvirtxml.StorageVolume](vol.GetXMLDesc(0))
	if err != nil {
		return false, err
	}
	gotMode := ""
	if vx.Target != nil && vx.Target.Permissions != nil {
		gotMode = vx.Target.Permissions.Mode
	}
	return sizeBytes(vx.Capacity) == size && (mode == "" || modeEqual(gotMode, mode)), nil
}

// modeEqual compares octal modes as numbers ("600" equals "0600").
func modeEqual(a, b string) bool {
	x, errA := strconv.ParseUint(a, 8, 32)
	y, errB := strconv.ParseUint(b, 8, 32)
	return errA == nil && errB == nil && x == y
}

// upload streams exactly size bytes from r into vol in uploadChunk pieces.
// When verify is set, it runs after the last byte and before the stream is
// finished; an error from it (or from ctx) aborts the upload.
//
// libvirt (9.0 at least) drops a write error its I/O thread meets after the
// client's last Send: Finish then succeeds over a volume that holds only
// part of the data (a pool filling up does exactly this). So the volume is
// read back and compared with what was sent before the upload counts.
func upload(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, vol *libvirt.StorageVol, r io.Reader, size int64, verify func() error) error {
	st, err := conn.NewStream(0)
	if err != nil {
		return err
	}
	defer st.Free()
	if err := vol.Upload(st, 0, uint64(size), 0); err != nil {
		return err
	}
	fail := func(err error) error {
		_ = st.Abort()
		return err
	}
	sent := sha256.New()
	r = io.TeeReader(r, sent)
	buf := make([]byte, min(uploadChunk, max(size, 1)))
	for done := int64(0); done < size; {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-done)])
		if err != nil {
			return fail(fmt.Errorf("reading source after %d of %d bytes: %w", done+int64(n), size, err))
		}
		for off := 0; off < n; {
			m, err := st.Send(buf[off:n])
			if err != nil {
				return fail(err)
			}
			off += m
		}
		done += int64(n)
	}
	if verify != nil {
		if err := verify(); err != nil {
			return fail(err)
		}
	}
	if err := st.Finish(); err != nil {
		return err
	}
	return checkWritten(ctx, conn, p, vol, size, sent.Sum(nil))
}

// errWriteLost says a volume read back differs from what was uploaded.
var errWriteLost = errors.New("the volume does not hold the uploaded bytes although libvirt reported success")

// checkWritten reads size bytes of vol back and compares their digest with
// want. A mismatch in a pool with less free space than the upload needed
// is ErrPoolFull: the error libvirt dropped was ENOSPC.
func checkWritten(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, vol *libvirt.StorageVol, size int64, want []byte) error {
	got, err := volumeDigest(ctx, conn, vol, size)
	if err != nil {
		return fmt.Errorf("reading the volume back: %w", err)
	}
	if bytes.Equal(got, want) {
		return nil
	}
	if refreshPool(ctx, p) == nil {
		if info, err := p.GetInfo(); err == nil && info.Available < uint64(size) {
			return fmt.Errorf("%w: %d bytes free: %w", ErrPoolFull, info.Available, errWriteLost)
		}
	}
	return errWriteLost
}

// volumeDigest is the SHA-256 of the first size bytes of vol.
func volumeDigest(ctx context.Context, conn *libvirt.Connect, vol *libvirt.StorageVol, size int64) ([]byte, error) {
	st, err := conn.NewStream(0)
	if err != nil {
		return nil, err
	}
	defer st.Free()
	if err := vol.Download(st, 0, uint64(size), 0); err != nil {
		return nil, err
	}
	h := sha256.New()
	buf := make([]byte, min(uploadChunk, max(size, 1)))
	for read := int64(0); read < size; {
		if err := ctx.Err(); err != nil {
			_ = st.Abort()
			return nil, err
		}
		n, err := st.Recv(buf)
		if err != nil {
			_ = st.Abort()
			return nil, err
		}
		if n == 0 {
			break
		}
		h.Write(buf[:n])
		read += int64(n)
	}
	if err := st.Finish(); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
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
