package virt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
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
// Imports into one pool are serialised. The volume name should identify
// the content (e.g. include a digest prefix): a complete volume is reused
// without re-reading the source.
func (c *Client) ImportImage(ctx context.Context, img ImageImport) (VolumeInfo, error) {
	want, err := hex.DecodeString(img.SHA256)
	if err != nil || len(want) != sha256.Size {
		return VolumeInfo{}, fmt.Errorf("image %s: sha256 must be 64 hex digits, got %q", img.Source, img.SHA256)
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
			info, err = importInto(ctx, conn, p, img)
			return wrapNoSpace(img.Pool, err)
		})
	})
	return info, err
}

// importInto runs one import attempt with the pool lock held.
func importInto(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, img ImageImport) (VolumeInfo, error) {
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
	if err := uploadImage(ctx, conn, p, img); err != nil {
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
	doc, err := rawVolumeXML(name, 0, secretMode).Marshal()
	if err != nil {
		return err
	}
	vol, err := p.StorageVolCreateXML(doc, 0)
	if err != nil {
		return fmt.Errorf("creating import marker %s: %w", name, err)
	}
	return vol.Free()
}

// uploadImage creates the raw image volume and streams the source into it,
// hashing on the way; a digest mismatch aborts before the stream finishes.
func uploadImage(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, img ImageImport) error {
	src, size, err := openSource(ctx, img.Source)
	if err != nil {
		return err
	}
	defer src.Close()
	vol, err := ensureRawVolume(p, img.Volume, uint64(size), "")
	if err != nil {
		return err
	}
	defer vol.Free()
	h := sha256.New()
	verify := func() error { return checkDigest(img, h) }
	if err := upload(ctx, conn, vol, io.TeeReader(src, h), size, verify); err != nil {
		return fmt.Errorf("importing %s into %s/%s: %w", img.Source, img.Pool, img.Volume, err)
	}
	return nil
}

func checkDigest(img ImageImport, h hash.Hash) error {
	got := hex.EncodeToString(h.Sum(nil))
	if !strings.EqualFold(got, img.SHA256) {
		return &ChecksumError{Source: img.Source, Expected: strings.ToLower(img.SHA256), Actual: got}
	}
	return nil
}

// openSource opens a local file or an http(s) URL and returns its exact
// length, which libvirt's upload needs up front.
func openSource(ctx context.Context, source string) (io.ReadCloser, int64, error) {
	if strings.HasPrefix(source, "http://") || strings.HasPrefix(source, "https://") {
		return openURL(ctx, source)
	}
	path := strings.TrimPrefix(source, "file://")
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("%w: %v", ErrImageNotFound, err)
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, errors.Join(err, fmt.Errorf("image %s is not a regular file", path))
	}
	return f, st.Size(), nil
}

func openURL(ctx context.Context, url string) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("fetching image: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		resp.Body.Close()
		return nil, 0, fmt.Errorf("%w: %s: %s", ErrImageNotFound, url, resp.Status)
	case resp.StatusCode != http.StatusOK:
		resp.Body.Close()
		return nil, 0, fmt.Errorf("fetching image %s: %s", url, resp.Status)
	case resp.ContentLength < 0:
		resp.Body.Close()
		return nil, 0, fmt.Errorf("fetching image %s: server sent no Content-Length, which the upload needs", url)
	}
	return resp.Body, resp.ContentLength, nil
}
