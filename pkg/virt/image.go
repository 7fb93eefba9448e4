package virt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

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
// connected and its response headers read, bounded by img.Fetch) before
// the pool is locked, so a server that never answers holds no pool. The
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
	unlock, err := c.lockPool(ctx, img.Pool)
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	var info VolumeInfo
	err = c.withConn(ctx, "ImportImage", func(conn *libvirt.Connect) error {
		return withPool(conn, img.Pool, func(p *libvirt.StoragePool) error {
			var err error
			info, err = importInto(ctx, conn, p, img, src, size)
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
func uploadImage(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, img ImageImport, src io.Reader, size int64) error {
	vol, err := ensureRawVolume(p, img.Volume, uint64(size), "")
	if err != nil {
		return err
	}
	defer vol.Free()
	verify := func(sent []byte) error { return checkDigest(img, sent) }
	if err := upload(ctx, conn, p, vol, src, size, verify); err != nil {
		return fmt.Errorf("importing %s into %s/%s: %w", img.Source, img.Pool, img.Volume, err)
	}
	return nil
}

func checkDigest(img ImageImport, sent []byte) error {
	got := hex.EncodeToString(sent)
	if !strings.EqualFold(got, img.SHA256) {
		return &ChecksumError{Source: img.Source, Expected: strings.ToLower(img.SHA256), Actual: got}
	}
	return nil
}

// openSource opens a local file or an http(s) URL and returns its exact
// length, which libvirt's upload needs up front; reads report img.Progress.
func openSource(ctx context.Context, img ImageImport) (io.ReadCloser, int64, error) {
	var (
		src  io.ReadCloser
		size int64
		err  error
	)
	if strings.HasPrefix(img.Source, "http://") || strings.HasPrefix(img.Source, "https://") {
		src, size, err = openURL(ctx, img.Source, img.Fetch)
	} else {
		src, size, err = openFile(strings.TrimPrefix(img.Source, "file://"))
	}
	if err != nil || img.Progress == nil {
		return src, size, err
	}
	img.Progress(0, size)
	return &progressReader{ReadCloser: src, total: size, report: img.Progress}, size, nil
}

func openFile(path string) (io.ReadCloser, int64, error) {
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

// openURL sends the request and reads the response headers within
// limits; the body it returns fails a read that waits longer than
// limits.IdleTimeout for data.
func openURL(ctx context.Context, url string, limits FetchLimits) (io.ReadCloser, int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel(nil)
		return nil, 0, err
	}
	resp, err := fetchClient(limits).Do(req)
	if err != nil {
		cancel(nil)
		return nil, 0, fmt.Errorf("fetching image: %w", err)
	}
	fail := func(err error) (io.ReadCloser, int64, error) {
		resp.Body.Close()
		cancel(nil)
		return nil, 0, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return fail(fmt.Errorf("%w: %s: %s", ErrImageNotFound, url, resp.Status))
	case resp.StatusCode != http.StatusOK:
		return fail(fmt.Errorf("fetching image %s: %s", url, resp.Status))
	case resp.ContentLength < 0:
		return fail(fmt.Errorf("fetching image %s: server sent no Content-Length, which the upload needs", url))
	}
	body := &idleReader{body: resp.Body, ctx: ctx, cancel: cancel, idle: limits.IdleTimeout}
	if body.idle > 0 {
		body.timer = time.AfterFunc(body.idle, body.expire)
	}
	return body, resp.ContentLength, nil
}

// fetchClient is an HTTP client with limits' connect and header timeouts
// (proxies from the environment, as http.DefaultClient).
func fetchClient(limits FetchLimits) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: limits.ConnectTimeout, KeepAlive: 30 * time.Second}
	t.DialContext = dialer.DialContext
	t.TLSHandshakeTimeout = limits.ConnectTimeout
	t.ResponseHeaderTimeout = limits.HeaderTimeout
	return &http.Client{Transport: t}
}

// ErrFetchIdle is the cause of a download that got no data for its idle timeout.
var ErrFetchIdle = errors.New("image server sent no data")

// idleReader cancels its request when no read returned data for idle.
type idleReader struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

func (r *idleReader) expire() {
	r.cancel(fmt.Errorf("%w for %s", ErrFetchIdle, r.idle))
}

// Read reads from the source, restarting the idle timer on progress; a
// read the timer cut short names the idle timeout as its cause.
func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	if n > 0 && r.timer != nil {
		r.timer.Reset(r.idle)
	}
	if err != nil && err != io.EOF {
		if cause := context.Cause(r.ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", cause, err)
		}
	}
	return n, err
}

// Close stops the idle timer, closes the source and releases the
// request's context.
func (r *idleReader) Close() error {
	if r.timer != nil {
		r.timer.Stop()
	}
	err := r.body.Close()
	r.cancel(nil)
	return err
}

// progressReader reports the bytes read so far.
type progressReader struct {
	io.ReadCloser
	done, total int64
	report      func(done, total int64)
}

// Read reads from the source and reports the bytes read so far.
func (r *progressReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 {
		r.done += int64(n)
		r.report(r.done, r.total)
	}
	return n, err
}
