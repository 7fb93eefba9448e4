package virt

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"libvirt.org/go/libvirt"
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
// or rename is needed, which libvirt cannot do cheaply for multi-GiB images.
//
// Imports into one pool are serialised; the source is opened (for a URL:
// connected and its response headers read, bounded by img.Fetch) and its
// first bytes inspected before the pool is locked, so a server that never
// answers holds no pool, and an image whose header names other files
// (ErrImageRefused) or that is longer than img.Policy allows
// (ErrImageTooLarge) never reaches it. The
// volume name should identify the content (e.g. include a digest prefix):
// a complete volume is reused without opening the source or locking.
func (c *Client) ImportImage(ctx context.Context, img ImageImport) (VolumeInfo, error) {
	want, err := hex.DecodeString(img.SHA256)
	if err != nil || len(want) != sha256.Size {
		return VolumeInfo{}, fmt.Errorf("image %s: sha256 must be 64 hex digits, got %q", img.Source, img.SHA256)
	}
	if info, ok, err := c.completeImage(ctx, img); err != nil || ok {
		return info, err
	}
	src, size, err := openSource(ctx, img)
	if err != nil {
		return VolumeInfo{}, err
	}
	defer src.Close()
	body, err := checkedSource(src, size, img)
	if err != nil {
		return VolumeInfo{}, err
	}
	unlock, err := c.lockPool(ctx, img.Pool)
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	var info VolumeInfo
	err = c.withConn(ctx, "ImportImage", func(conn *libvirt.Connect) error {
		return withPool(conn, img.Pool, func(p *libvirt.StoragePool) error {
			var err error
			info, err = importInto(ctx, conn, p, img, body, size)
			return wrapNoSpace(img.Pool, err)
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

// importInto runs one import attempt with the pool lock held.
func importInto(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, img ImageImport, src io.Reader, size int64) (VolumeInfo, error) {
	marker := img.Volume + partialSuffix
	partial, err := volumeExists(p, marker)
	if err != nil {
		return VolumeInfo{}, err
	}
	if partial {
		// Leftover of an interrupted import: never reuse it.
		if err := deleteVolume(p, img.Volume); err != nil {
			return VolumeInfo{}, fmt.Errorf("removing incomplete %s: %w", img.Volume, err)
		}
	} else {
		var info VolumeInfo
		err := withVolume(p, img.Volume, func(v *libvirt.StorageVol) error {
			var err error
			info, err = describeVolume(img.Pool, v)
			return err
		})
		if !IsNotFound(err) {
			return info, err
		}
		if err := createMarker(p, marker); err != nil {
			return VolumeInfo{}, err
		}
	}
	if err := uploadImage(ctx, conn, p, img, src, size); err != nil {
		// Undo the half-done work; the marker goes last so that a crash
		// during this cleanup still leaves the volume recognisably bad.
		if derr := deleteVolume(p, img.Volume); derr == nil {
			_ = deleteVolume(p, marker)
		}
		return VolumeInfo{}, err
	}
	if err := deleteVolume(p, marker); err != nil {
		return VolumeInfo{}, fmt.Errorf("committing import of %s: %w", img.Volume, err)
	}
	// The volume was created raw; the rescan probes its real format (qcow2
	// images) and virtual size.
	if err := refreshPool(ctx, p); err != nil {
		return VolumeInfo{}, err
	}
	var info VolumeInfo
	err = withVolume(p, img.Volume, func(v *libvirt.StorageVol) error {
		var err error
		info, err = describeVolume(img.Pool, v)
		return err
	})
	return info, err
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

// uploadImage creates the raw image volume and streams the source into it,
// hashing on the way; a digest mismatch aborts before the stream finishes.
// A source of unknown length (size < 0) starts from an empty volume.
func uploadImage(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, img ImageImport, src io.Reader, size int64) error {
	vol, err := ensureRawVolume(p, img.Volume, uint64(max(size, 0)), "")
	if err != nil {
		return err
	}
	defer vol.Free()
	verify := func(sent []byte) error { return checkDigest(img, sent) }
	if _, err := upload(ctx, conn, p, vol, src, size, verify); err != nil {
		return fmt.Errorf("importing %s into %s/%s: %w", RedactURL(img.Source), img.Pool, img.Volume, err)
	}
	return nil
}

// checkedSource refuses an image longer than img.Policy.MaxBytes or whose
// first bytes make it something other than plain data (inspectImage),
// before anything reaches the pool, and returns the source to upload:
// bounded, with the bytes inspected still to be read.
func checkedSource(src io.Reader, size int64, img ImageImport) (io.Reader, error) {
	limit := img.Policy.MaxBytes
	if limit > 0 && size > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, the bound is %d (--image-import-max-size)", ErrImageTooLarge, RedactURL(img.Source), size, limit)
	}
	if limit > 0 {
		src = &boundedReader{r: src, left: limit, limit: limit}
	}
	head := bufio.NewReaderSize(src, imageHeadBytes)
	peek, err := head.Peek(imageHeadBytes)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("reading the start of %s: %w", RedactURL(img.Source), err)
	}
	if _, err := inspectImage(peek); err != nil {
		return nil, fmt.Errorf("%s: %w", RedactURL(img.Source), err)
	}
	return head, nil
}

// boundedReader fails with ErrImageTooLarge once its source gave more
// than limit bytes: a server that sends no length, or an endless one.
type boundedReader struct {
	r           io.Reader
	left, limit int64
}

// Read reads from the source and fails past the bound.
func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, fmt.Errorf("%w: the source sent more than %d bytes (--image-import-max-size)", ErrImageTooLarge, b.limit)
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, fmt.Errorf("%w: the source sent more than %d bytes (--image-import-max-size)", ErrImageTooLarge, b.limit)
	}
	return n, err
}

func checkDigest(img ImageImport, sent []byte) error {
	got := hex.EncodeToString(sent)
	if !strings.EqualFold(got, img.SHA256) {
		return &ChecksumError{Source: img.Source, Expected: strings.ToLower(img.SHA256), Actual: got}
	}
	return nil
}
