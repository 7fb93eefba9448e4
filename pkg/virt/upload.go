package virt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strconv"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

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
			if _, err := upload(ctx, conn, p, vol, bytes.NewReader(data), int64(len(data)), nil); err != nil {
				return wrapNoSpace(pool, fmt.Errorf("uploading %s/%s: %w", pool, name, err))
			}
			info, err = describeVolume(pool, vol)
			return err
		})
	})
	return info, err
}

// ReadVolume returns up to the first limit bytes of a volume, read through
// libvirt (so also over a remote connection); IsNotFound(err) when the
// volume does not exist.
func (c *Client) ReadVolume(ctx context.Context, pool, name string, limit int64) ([]byte, error) {
	var data []byte
	err := c.withConn(ctx, "ReadVolume", func(conn *libvirt.Connect) error {
		return withPool(conn, pool, func(p *libvirt.StoragePool) error {
			vol, err := p.LookupStorageVolByName(name)
			if err != nil {
				return err
			}
			defer vol.Free()
			data, err = volumeHead(ctx, conn, vol, limit)
			return err
		})
	})
	return data, err
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

// upload streams size bytes from r into vol in uploadChunk pieces; a
// negative size streams r to its end, the volume growing as written.
// When verify is set, it gets the SHA-256 of the bytes sent after the last
// one and before the stream is finished; an error from it (or from ctx)
// aborts the upload. It returns how many bytes it sent.
//
// libvirt (9.0 at least) drops a write error its I/O thread meets after the
// client's last Send: Finish then succeeds over a volume that holds only
// part of the data (a pool filling up does exactly this). So the volume is
// read back and compared with what was sent before the upload counts.
func upload(ctx context.Context, conn *libvirt.Connect, p *libvirt.StoragePool, vol *libvirt.StorageVol, r io.Reader, size int64, verify func(sent []byte) error) (int64, error) {
	st, err := conn.NewStream(0)
	if err != nil {
		return 0, err
	}
	defer st.Free()
	// Length 0 is libvirt's "up to the end of the stream".
	if err := vol.Upload(st, 0, uint64(max(size, 0)), 0); err != nil {
		return 0, err
	}
	fail := func(err error) (int64, error) {
		_ = st.Abort()
		return 0, err
	}
	sent := sha256.New()
	r = io.TeeReader(r, sent)
	buf := make([]byte, uploadChunk)
	if size >= 0 {
		buf = buf[:min(uploadChunk, max(size, 1))]
	}
	done := int64(0)
	for size < 0 || done < size {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		want := int64(len(buf))
		if size >= 0 {
			want = min(want, size-done)
		}
		n, err := io.ReadFull(r, buf[:want])
		if size < 0 && (err == io.EOF || err == io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		if err != nil && (size >= 0 || err != io.EOF) {
			return fail(fmt.Errorf("reading source after %d bytes: %w", done+int64(n), err))
		}
		for off := 0; off < n; {
			m, err := st.Send(buf[off:n])
			if err != nil {
				return fail(err)
			}
			off += m
		}
		done += int64(n)
		if err == io.EOF {
			break
		}
	}
	digest := sent.Sum(nil)
	if verify != nil {
		if err := verify(digest); err != nil {
			return fail(err)
		}
	}
	if err := st.Finish(); err != nil {
		return 0, err
	}
	return done, checkWritten(ctx, conn, p, vol, done, digest)
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
	return poolFullOr(ctx, p, size, errWriteLost)
}

// poolFullOr returns err as ErrPoolFull when p, rescanned, has less free
// space than the need bytes an upload was writing: libvirt does not always
// report the ENOSPC of its writer, and may report it as a broken stream.
func poolFullOr(ctx context.Context, p *libvirt.StoragePool, need int64, err error) error {
	if err == nil || need <= 0 || errors.Is(err, ErrPoolFull) || refreshPool(ctx, p) != nil {
		return err
	}
	if info, ierr := p.GetInfo(); ierr == nil && info.Available < uint64(need) {
		return fmt.Errorf("%w: %d bytes free: %w", ErrPoolFull, info.Available, err)
	}
	return err
}

// volumeDigest is the SHA-256 of the first size bytes of vol.
func volumeDigest(ctx context.Context, conn *libvirt.Connect, vol *libvirt.StorageVol, size int64) ([]byte, error) {
	h := sha256.New()
	if err := download(ctx, conn, vol, size, h); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// volumeHead is up to the first n bytes of vol.
func volumeHead(ctx context.Context, conn *libvirt.Connect, vol *libvirt.StorageVol, n int64) ([]byte, error) {
	var b bytes.Buffer
	err := download(ctx, conn, vol, n, &b)
	return b.Bytes(), err
}

// download writes up to the first size bytes of vol to w.
func download(ctx context.Context, conn *libvirt.Connect, vol *libvirt.StorageVol, size int64, w io.Writer) error {
	st, err := conn.NewStream(0)
	if err != nil {
		return err
	}
	defer st.Free()
	if err := vol.Download(st, 0, uint64(size), 0); err != nil {
		return err
	}
	buf := make([]byte, min(uploadChunk, max(size, 1)))
	for read := int64(0); read < size; {
		if err := ctx.Err(); err != nil {
			_ = st.Abort()
			return err
		}
		n, err := st.Recv(buf[:min(int64(len(buf)), size-read)])
		if err == io.EOF || (err == nil && n == 0) {
			break // the volume is shorter than size
		}
		if err != nil {
			_ = st.Abort()
			return err
		}
		w.Write(buf[:n])
		read += int64(n)
	}
	return st.Finish()
}
