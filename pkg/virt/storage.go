package virt

import (
	"context"
	"errors"
	"fmt"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/diskimage"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/imagefetch"
)

// ImageImport describes a base image to bring into a pool.
type ImageImport struct {
	// Pool receives the volume; it must exist (EnsurePool).
	Pool string
	// Volume is the final volume name; the caller gives it NamePrefix.
	Volume string
	// Source is a file:// URL (or an absolute path) on the controller's
	// host or an http(s) URL. It is streamed through libvirt, so the
	// libvirt host may be remote.
	Source string
	// SHA256 is the expected hex digest of Source's bytes.
	SHA256 string
	// Fetch bounds an http(s) download; a zero field sets no bound. The
	// caller's context bounds the whole import.
	Fetch FetchLimits
	// Policy is what Source may reach and how long it may be; its zero
	// value refuses files.
	Policy SourcePolicy
	// DiskBytes is the virtual size of the disk the image becomes, zero
	// when the disk takes the image's size. A raw source longer than it,
	// or a qcow2 whose header describes a larger disk, is refused
	// (ErrImageLargerThanDisk): an overlay could never use it. A stream
	// is cut as soon as it passes what such a disk can hold
	// (diskimage.StreamBound), so an endless body costs at most that much.
	DiskBytes uint64
	// Progress, when set, is called as the source is read, with the bytes
	// read so far and the source's length.
	Progress func(done, total int64)
}

// FetchLimits bound the phases of an image download (imagefetch.Limits).
type FetchLimits = imagefetch.Limits

// OverlaySpec describes a copy-on-write disk on a base volume.
type OverlaySpec struct {
	// Pool and Name place the overlay volume.
	Pool string
	Name string
	// BackingPool and BackingVolume name the base image volume.
	BackingPool   string
	BackingVolume string
	// CapacityBytes is the requested virtual size; zero takes the base's.
	// A base larger than it is refused.
	CapacityBytes uint64
	// MaxCapacityBytes, when set, bounds the overlay whatever the base:
	// a VM that takes its disk size from the image (the HAProxy VM) must
	// not grow past the operator's largest disk by naming a big image.
	MaxCapacityBytes uint64
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
	// BackingPath and BackingFormat name the volume's backing file as its
	// own header does: for the provider's overlays, the base image and
	// the format the provider checked it to be.
	BackingPath, BackingFormat string
	// BackingMissing is true when BackingPath names no volume of an active
	// pool: the disk cannot be read (set by VolumeInfo and EnsureOverlay).
	BackingMissing bool
}

// ErrBaseImageMissing is EnsureOverlay's refusal to reuse an overlay whose
// base image is gone: the disk it is cannot be read, and writing a new one
// over it would lose what the VM wrote.
var ErrBaseImageMissing = errors.New("the overlay's base image is gone")

// partialSuffix names the marker volume that exists while an import into
// the volume without the suffix is incomplete.
const partialSuffix = ".partial"

// uploadChunk is the stream chunk size: libvirt's per-message overhead made
// small chunks 100× slower (a 29 MB upload took 95 s with small chunks).
const uploadChunk = 1 << 20

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
	if b := vx.BackingStore; b != nil {
		info.BackingPath = b.Path
		if b.Format != nil {
			info.BackingFormat = b.Format.Type
		}
	}
	info.CapacityBytes = sizeBytes(vx.Capacity)
	info.AllocationBytes = sizeBytes(vx.Allocation)
	return info, nil
}

// baseFormat reads the first bytes of vol through libvirt (so remote hosts
// work) and returns the format they show, refusing what diskimage.Inspect
// refuses.
func baseFormat(ctx context.Context, conn *libvirt.Connect, vol *libvirt.StorageVol) (string, error) {
	head, err := volumeHead(ctx, conn, vol, diskimage.HeadBytes)
	if err != nil {
		return "", fmt.Errorf("reading the base image's header: %w", err)
	}
	format, err := diskimage.Inspect(head)
	if err != nil {
		name, _ := vol.GetName()
		return "", fmt.Errorf("base volume %s: %w", name, err)
	}
	return format, nil
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

// VolumeInfo describes a volume, with whether its backing file is gone;
// IsNotFound(err) when it or its pool does not exist.
func (c *Client) VolumeInfo(ctx context.Context, pool, name string) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withConn(ctx, "VolumeInfo", func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			return withVolume(p, name, func(v *libvirt.StorageVol) error {
				var err error
				if info, err = describeVolume(pool, v); err != nil {
					return err
				}
				info.BackingMissing, err = backingMissing(conn, info)
				return err
			})
		})
	})
	return info, err
}

// backingMissing tells whether info's backing file names no volume of an
// active pool. The provider's overlays are always backed by a pool volume,
// and the collector deletes images through libvirt, which forgets them at
// once.
func backingMissing(conn *libvirt.Connect, info VolumeInfo) (bool, error) {
	if info.BackingPath == "" {
		return false, nil
	}
	vol, err := conn.LookupStorageVolByPath(info.BackingPath)
	if IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up the backing file %s of %s/%s: %w", info.BackingPath, info.Pool, info.Name, err)
	}
	return false, vol.Free()
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

// EnsureOverlay creates a qcow2 overlay backed by a base volume with the
// requested capacity, or the base's when none is requested; a base larger
// than the request is ErrImageLargerThanDisk, as a disk silently larger
// than asked would pass the operator's bounds. An existing overlay is
// reused and grown when a larger capacity is requested, never shrunk.
// ErrImageNotFound when the base is missing or its import is incomplete.
// The base's format is read from its own first bytes, never from libvirt's
// probe, and a base that names other files is refused (ErrImageRefused):
// an operator's image pool may hold volumes nobody inspected on import.
// An existing overlay whose backing file is gone is ErrBaseImageMissing.
// The base's image lock is held shared throughout, so that the image
// collector (DeleteUnusedImage) never deletes a base between this check
// and the overlay's creation (imageLocks).
func (c *Client) EnsureOverlay(ctx context.Context, spec OverlaySpec) (VolumeInfo, error) {
	defer c.images.share(VolumeRef{Pool: spec.BackingPool, Name: spec.BackingVolume})()
	var info VolumeInfo
	err := c.withConn(ctx, "EnsureOverlay", func(conn *libvirt.Connect) error {
		var base VolumeInfo
		err := withPool(conn, spec.BackingPool, func(bp *libvirt.StoragePool) error {
			if partial, err := volumeExists(bp, spec.BackingVolume+partialSuffix); err != nil || partial {
				return errors.Join(err, fmt.Errorf("%w: import of %s/%s is incomplete", ErrImageNotFound, spec.BackingPool, spec.BackingVolume))
			}
			return withVolume(bp, spec.BackingVolume, func(v *libvirt.StorageVol) error {
				var err error
				if base, err = describeVolume(spec.BackingPool, v); err != nil {
					return err
				}
				base.Format, err = baseFormat(ctx, conn, v)
				return err
			})
		})
		if IsNotFound(err) {
			return fmt.Errorf("%w: base %s/%s: %v", ErrImageNotFound, spec.BackingPool, spec.BackingVolume, err)
		}
		if err != nil {
			return err
		}
		if spec.CapacityBytes > 0 && base.CapacityBytes > spec.CapacityBytes {
			return fmt.Errorf("%w: base %s/%s is %d bytes, the disk asked for %d", ErrImageLargerThanDisk, spec.BackingPool, spec.BackingVolume, base.CapacityBytes, spec.CapacityBytes)
		}
		capacity := max(spec.CapacityBytes, base.CapacityBytes)
		if spec.MaxCapacityBytes > 0 && capacity > spec.MaxCapacityBytes {
			return fmt.Errorf("%w: base %s/%s makes a disk of %d bytes, more than the %d allowed", ErrDiskTooLarge, spec.BackingPool, spec.BackingVolume, capacity, spec.MaxCapacityBytes)
		}
		return withPool(conn, spec.Pool, func(p *libvirt.StoragePool) error {
			info, err = ensureOverlayIn(conn, p, spec, base, capacity)
			return wrapNoSpace(spec.Pool, err)
		})
	})
	return info, err
}

func ensureOverlayIn(conn *libvirt.Connect, p *libvirt.StoragePool, spec OverlaySpec, base VolumeInfo, capacity uint64) (VolumeInfo, error) {
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
	if err != nil {
		return info, err
	}
	if info.BackingMissing, err = backingMissing(conn, info); err != nil || info.BackingMissing {
		return info, errors.Join(err, missingBase(info))
	}
	if info.CapacityBytes >= capacity {
		return info, nil
	}
	if err := vol.Resize(capacity, 0); err != nil {
		return VolumeInfo{}, fmt.Errorf("growing overlay %s/%s to %d bytes: %w", spec.Pool, spec.Name, capacity, err)
	}
	return describeVolume(spec.Pool, vol)
}

// missingBase is ErrBaseImageMissing for an overlay info describes, when
// info.BackingMissing.
func missingBase(info VolumeInfo) error {
	if !info.BackingMissing {
		return nil
	}
	return fmt.Errorf("%w: %s/%s is backed by %s, which no volume of an active pool is", ErrBaseImageMissing, info.Pool, info.Name, info.BackingPath)
}
