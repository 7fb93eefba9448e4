package virt

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/diskimage"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/imagefetch"
)

// ImportImage brings a base image into a pool once.
//
// Crash safety: the volume's final name alone never means "complete".
// Before the image volume is created, an empty marker volume
// "<volume>.partial" is created; it is deleted only after every byte was
// uploaded and the sha256 matched, and that deletion (one unlink on the
// libvirt host) is the commit point. A crash of the controller, of libvirtd
// or of the host at any earlier moment leaves the marker behind, and the
// next import (and EnsureOverlay, which refuses such a base) treats the
// volume as garbage: both are deleted and the import starts over. No copy
// or rename is needed, which libvirt cannot do cheaply (or at all) for
// multi-GiB images.
//
// No shared lock is held while bytes flow: the volume being written is the
// import's own (claimImport: one import per pool and volume at a time in
// this process; imports of other volumes run alongside), and the pool lock
// is taken only to create the marker and the volume and to commit, each a
// few libvirt calls. libvirt itself lets volumes be created, deleted and
// the pool refreshed while another volume uploads.
//
// The source is opened (for a URL: connected and its response headers
// read, bounded by img.Fetch) and its first bytes inspected before
// anything is created, so a server that never answers creates nothing, and
// an image whose header names other files (ErrImageRefused), that is longer
// than img.Policy allows (ErrImageTooLarge) or than img.DiskBytes can use
// (ErrImageLargerThanDisk) never reaches the pool; a stream that runs past
// those bounds is cut there. The volume name should identify the content
// (e.g. include a digest prefix): a complete volume is reused without
// opening the source.
func (c *Client) ImportImage(ctx context.Context, img ImageImport) (VolumeInfo, error) {
	want, err := hex.DecodeString(img.SHA256)
	if err != nil || len(want) != sha256.Size {
		return VolumeInfo{}, fmt.Errorf("image %s: sha256 must be 64 hex digits, got %q", img.Source, img.SHA256)
	}
	release, err := c.claimImport(ctx, img.Pool, img.Volume)
	if err != nil {
		return VolumeInfo{}, err
	}
	defer release()
	if info, ok, err := c.completeImage(ctx, img); err != nil || ok {
		return info, err
	}
	src, size, err := imagefetch.Open(ctx, img.Source, img.Fetch, img.Policy, img.Progress)
	if err != nil {
		return VolumeInfo{}, err
	}
	defer src.Close()
	body, err := checkedSource(src, size, img)
	if err != nil {
		return VolumeInfo{}, err
	}
	info, done, err := c.prepareImport(ctx, img, size)
	if err != nil || done {
		return info, err
	}
	if err := c.streamImport(ctx, img, body, size); err != nil {
		c.abandonImport(img)
		return VolumeInfo{}, err
	}
	return c.commitImport(ctx, img)
}

// importClaimKey prefixes the lock-table keys of claimImport; no pool is
// named with a slash.
const importClaimKey = "import/"

// claimImport makes pool/volume this import's own until release: another
// import of the same volume in this process waits (and then finds it
// complete), so no import deletes, as an interrupted one's leftover, a
// volume another is still writing.
func (c *Client) claimImport(ctx context.Context, pool, volume string) (func(), error) {
	l := c.poolLock(importClaimKey + pool + "/" + volume)
	select {
	case l <- struct{}{}:
		return func() { <-l }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another import of %s/%s: %w", pool, volume, ctx.Err())
	}
}

// withPoolLocked runs fn on pool with the pool lock held: for the short
// steps of an import that create or delete volumes.
func (c *Client) withPoolLocked(ctx context.Context, pool string, fn func(*libvirt.Connect, *libvirt.StoragePool) error) error {
	unlock, err := c.lockPool(ctx, pool)
	if err != nil {
		return err
	}
	defer unlock()
	return c.withConn(ctx, "ImportImage", func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			return wrapNoSpace(pool, fn(conn, p))
		})
	})
}

// prepareImport removes an interrupted import's leftover, or reports a
// volume completed meanwhile (done), and creates the marker and the empty
// raw volume the stream goes to.
func (c *Client) prepareImport(ctx context.Context, img ImageImport, size int64) (VolumeInfo, bool, error) {
	var info VolumeInfo
	done := false
	err := c.withPoolLocked(ctx, img.Pool, func(_ *libvirt.Connect, p *libvirt.StoragePool) error {
		marker := img.Volume + partialSuffix
		partial, err := volumeExists(p, marker)
		if err != nil {
			return err
		}
		if partial {
			// Leftover of an interrupted import: never reuse it.
			if err := deleteVolume(p, img.Volume); err != nil {
				return fmt.Errorf("removing incomplete %s: %w", img.Volume, err)
			}
		} else {
			err := withVolume(p, img.Volume, func(v *libvirt.StorageVol) error {
				var err error
				info, err = describeVolume(img.Pool, v)
				return err
			})
			if !IsNotFound(err) {
				done = err == nil
				return err
			}
			if err := createMarker(p, marker); err != nil {
				return err
			}
		}
		vol, err := ensureRawVolume(p, img.Volume, uint64(max(size, 0)), "")
		if err != nil {
			return err
		}
		return vol.Free()
	})
	return info, done, err
}

// streamImport uploads the source into the import's own volume, hashing on
// the way; a digest mismatch aborts before the stream finishes. No lock is
// held: a slow source delays only this import.
func (c *Client) streamImport(ctx context.Context, img ImageImport, src io.Reader, size int64) error {
	var first error
	err := c.withConn(ctx, "ImportImage", func(conn *libvirt.Connect) error {
		// withConn calls again after a lost connection, but the source
		// cannot be read again: the rest of it would hash to a mismatch
		// that looks like the source's fault. Fail as the connection did.
		if first != nil {
			return fmt.Errorf("%w: %w", errStreamInterrupted, first)
		}
		first = withPool(conn, img.Pool, func(p *libvirt.StoragePool) error {
			return withVolume(p, img.Volume, func(vol *libvirt.StorageVol) error {
				verify := func(sent []byte) error { return checkDigest(img, sent) }
				_, err := upload(ctx, conn, p, vol, src, size, verify)
				return poolFullOr(ctx, p, size, wrapNoSpace(img.Pool, err))
			})
		})
		return first
	})
	if err != nil {
		return fmt.Errorf("importing %s into %s/%s: %w", RedactURL(img.Source), img.Pool, img.Volume, err)
	}
	return nil
}

// errStreamInterrupted fails an import whose libvirt connection was lost
// mid-stream; the attempt is retried from the start.
var errStreamInterrupted = errors.New("the libvirt connection was lost while the image streamed")

// abandonImport undoes a failed attempt; the marker goes last so that a
// crash during this cleanup still leaves the volume recognisably bad. It
// runs on a context of its own: the attempt's may be what ended.
func (c *Client) abandonImport(img ImageImport) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_ = c.withPoolLocked(ctx, img.Pool, func(_ *libvirt.Connect, p *libvirt.StoragePool) error {
		if err := deleteVolume(p, img.Volume); err != nil {
			return err
		}
		return deleteVolume(p, img.Volume+partialSuffix)
	})
}

// cleanupTimeout bounds the removal of a failed import's volumes.
const cleanupTimeout = 30 * time.Second

// commitImport deletes the marker, the commit point, and describes the
// image as libvirt's rescan of the pool sees it.
func (c *Client) commitImport(ctx context.Context, img ImageImport) (VolumeInfo, error) {
	var info VolumeInfo
	err := c.withPoolLocked(ctx, img.Pool, func(_ *libvirt.Connect, p *libvirt.StoragePool) error {
		if err := deleteVolume(p, img.Volume+partialSuffix); err != nil {
			return fmt.Errorf("committing import of %s: %w", img.Volume, err)
		}
		// The volume was created raw; the rescan probes its real format
		// (qcow2 images) and virtual size.
		if err := refreshPool(ctx, p); err != nil {
			return err
		}
		return withVolume(p, img.Volume, func(v *libvirt.StorageVol) error {
			var err error
			info, err = describeVolume(img.Pool, v)
			return err
		})
	})
	return info, err
}

// completeImage describes img's volume when a finished import left it.
func (c *Client) completeImage(ctx context.Context, img ImageImport) (VolumeInfo, bool, error) {
	var info VolumeInfo
	found := false
	err := c.withConn(ctx, "ImportImage", func(conn *libvirt.Connect) error {
		return withPool(conn, img.Pool, func(p *libvirt.StoragePool) error {
			if partial, err := volumeExists(p, img.Volume+partialSuffix); err != nil || partial {
				return err
			}
			err := withVolume(p, img.Volume, func(v *libvirt.StorageVol) error {
				var err error
				info, err = describeVolume(img.Pool, v)
				return err
			})
			if IsNotFound(err) {
				return nil
			}
			found = err == nil
			return err
		})
	})
	return info, found, err
}

func createMarker(p *libvirt.StoragePool, name string) error {
	vol, err := createEmptyVolume(p, name)
	if err != nil {
		return fmt.Errorf("creating import marker %s: %w", name, err)
	}
	return vol.Free()
}

// createEmptyVolume creates an empty raw volume, mode 0600.
func createEmptyVolume(p *libvirt.StoragePool, name string) (*libvirt.StorageVol, error) {
	doc, err := rawVolumeXML(name, 0, secretMode).Marshal()
	if err != nil {
		return nil, err
	}
	return p.StorageVolCreateXML(doc, 0)
}

// checkedSource refuses an image longer than img.Policy.MaxBytes, whose
// first bytes make it something other than plain data (diskimage.Inspect), or
// that the disk it becomes cannot use (img.DiskBytes), before anything
// reaches the pool, and returns the source to upload: bounded by the
// smaller of those limits, with the bytes inspected still to be read.
func checkedSource(src io.Reader, size int64, img ImageImport) (io.Reader, error) {
	shown := RedactURL(img.Source)
	limit := img.Policy.MaxBytes
	if limit > 0 && size > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, the bound is %d (--image-import-max-size)", ErrImageTooLarge, shown, size, limit)
	}
	if limit > 0 {
		src = &boundedReader{r: src, left: limit, limit: limit, err: ErrImageTooLarge, why: "--image-import-max-size"}
	}
	head := bufio.NewReaderSize(src, diskimage.HeadBytes)
	peek, err := head.Peek(diskimage.HeadBytes)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("reading the start of %s: %w", shown, err)
	}
	format, err := diskimage.Inspect(peek)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", shown, err)
	}
	if img.DiskBytes == 0 {
		return head, nil
	}
	bound, err := diskimage.StreamBound(format, peek, img.DiskBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", shown, err)
	}
	if size > bound {
		return nil, fmt.Errorf("%w: %s is %d bytes, a %s image for a disk of %d bytes is at most %d", ErrImageLargerThanDisk, shown, size, format, img.DiskBytes, bound)
	}
	return &boundedReader{r: head, left: bound, limit: bound, err: ErrImageLargerThanDisk, why: fmt.Sprintf("what a %s image for a disk of %d bytes can hold", format, img.DiskBytes)}, nil
}

// boundedReader fails with err once its source gave more than limit
// bytes: a server that sends no length, or an endless one.
type boundedReader struct {
	r           io.Reader
	left, limit int64
	err         error
	why         string
}

// Read reads from the source and fails past the bound.
func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.exceeded()
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, b.exceeded()
	}
	return n, err
}

func (b *boundedReader) exceeded() error {
	return fmt.Errorf("%w: the source sent more than %d bytes (%s)", b.err, b.limit, b.why)
}

func checkDigest(img ImageImport, sent []byte) error {
	got := hex.EncodeToString(sent)
	if !strings.EqualFold(got, img.SHA256) {
		return &ChecksumError{Source: img.Source, Expected: strings.ToLower(img.SHA256), Actual: got}
	}
	return nil
}
