package virt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestSlowImportDoesNotHoldThePool: while one import's server has sent
// the start of its image and then stalls, another import into the same
// pool completes; the stalled one completes once its server goes on. With
// the pool lock held for a whole stream, the second import waited for the
// first, which waited for the test: it failed when its context ended.
func TestSlowImportDoesNotHoldThePool(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	content := make([]byte, 2*mib)
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	sent, goOn := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		_, _ = w.Write(content[:256<<10])
		w.(http.Flusher).Flush()
		close(sent)
		select {
		case <-goOn:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write(content[256<<10:])
	}))
	t.Cleanup(srv.Close)

	slow := virt.ImageImport{Pool: e.pool, Volume: e.volName(t, "slow"), Source: srv.URL + "/slow.raw", SHA256: sha256Hex(content)}
	slowDone := make(chan error, 1)
	go func() {
		_, err := e.c.ImportImage(ctx, slow)
		slowDone <- err
	}()
	<-sent
	// The slow import streams once its marker and volume exist.
	waitVolume(t, e, slow.Volume+".partial")

	fast, fastSum := randomFile(t, int(mib))
	fastCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The stalled import can end only when the test lets it: if it
		// ends first, the fast one waited for it.
		select {
		case err := <-slowDone:
			slowDone <- err
			cancel()
		case <-fastCtx.Done():
		}
	}()
	if _, err := e.c.ImportImage(fastCtx, virt.ImageImport{Pool: e.pool, Volume: e.volName(t, "fast"), Source: fast,
		SHA256: fastSum, Policy: testlibvirt.FilePolicy(fast)}); err != nil {
		t.Fatalf("import beside a stalled one: %v", err)
	}
	if _, err := e.c.VolumeInfo(ctx, e.pool, slow.Volume+".partial"); err != nil {
		t.Fatalf("the stalled import is no longer running: %v", err)
	}
	close(goOn)
	if err := <-slowDone; err != nil {
		t.Fatalf("stalled import, once its server went on: %v", err)
	}
	e.assertNoVolume(t, slow.Volume+".partial")
}

// waitVolume polls until pool holds name (or the test's context ends).
func waitVolume(t *testing.T, e storageEnv, name string) {
	t.Helper()
	ctx := testCtx(t)
	for {
		_, err := e.c.VolumeInfo(ctx, e.pool, name)
		if err == nil {
			return
		}
		if !virt.IsNotFound(err) || ctx.Err() != nil {
			t.Fatalf("waiting for volume %s: %v", name, err)
		}
	}
}

// qcow2Head is the first cluster of an empty qcow2 of virtual size, with
// 64 KiB clusters: what an endless server sends before its garbage.
func qcow2Head(t *testing.T, virtual uint64) []byte {
	t.Helper()
	p, _ := qcow2File(t, virtual)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint64(b[24:]) != virtual {
		t.Fatalf("qemu-img wrote virtual size %d", binary.BigEndian.Uint64(b[24:]))
	}
	return b[:64<<10]
}

// TestImportStopsPastTheDisk: for a machine whose disk is 8 MiB, an
// endless raw body and an endless body after a qcow2 header of 8 MiB are
// cut shortly after what such a disk can hold; a qcow2 describing a
// larger disk and a Content-Length above the disk are refused before the
// body is read. Each is ErrImageLargerThanDisk and leaves nothing in the
// pool. Before, only the operator's global bound (here 1 GiB, 32 GiB by
// default) stopped them: the endless bodies were read to it.
func TestImportStopsPastTheDisk(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	const disk = 8 * mib
	heads := map[string][]byte{"/raw": nil, "/qcow2": qcow2Head(t, disk), "/qcow2-large": qcow2Head(t, 4*disk)}
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/announced" {
			w.Header().Set("Content-Length", strconv.FormatUint(disk+1, 10))
		}
		n, _ := w.Write(heads[r.URL.Path])
		written.Add(int64(n))
		buf := bytes.Repeat([]byte{0xa5}, 1<<20)
		for r.Context().Err() == nil && written.Load() < int64(gib) {
			n, err := w.Write(buf)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	// Socket buffers on both ends hold a few MiB the importer never read.
	const slack = 16 * mib
	tests := []struct {
		path    string
		most    uint64 // bytes the server may get out
		message string
	}{
		{"/raw", disk + slack, "can hold"},
		{"/qcow2", disk*11/10 + 128*64<<10 + slack, "can hold"},
		{"/qcow2-large", slack, "describes a disk of"},
		{"/announced", slack, "is 8388609 bytes"},
	}
	for i, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			written.Store(0)
			vol := e.volName(t, "disk"+strconv.Itoa(i))
			_, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: srv.URL + tt.path,
				SHA256: sha256Hex(nil), DiskBytes: disk, Policy: virt.SourcePolicy{MaxBytes: int64(gib)}})
			if !errors.Is(err, virt.ErrImageLargerThanDisk) {
				t.Fatalf("want ErrImageLargerThanDisk, got %v", err)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tt.message)) {
				t.Errorf("error %q does not say %q", err, tt.message)
			}
			srv.CloseClientConnections() // the handler's writes fail: its count is final
			if n := uint64(written.Load()); n > tt.most {
				t.Errorf("the server got %d bytes out, want at most %d", n, tt.most)
			}
			t.Logf("refused after the server wrote %d bytes: %v", written.Load(), err)
			e.assertNoVolume(t, vol)
			e.assertNoVolume(t, vol+".partial")
		})
	}
}

// TestImageUsesAndDeleteUnusedImage: an image an overlay is backed by is
// listed with that user and not deleted (ErrImageInUse); an image nobody
// uses is listed without users and deleted; a volume the filter does not
// accept is never deleted.
func TestImageUsesAndDeleteUnusedImage(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	src, sum := qcow2File(t, 64*mib)
	used, unused, overlay := e.volName(t, "image-used"), e.volName(t, "image-unused"), e.volName(t, "overlay")
	isImage := func(n string) bool { return n == used || n == unused }
	for _, vol := range []string{used, unused} {
		if _, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: src, SHA256: sum, Policy: testlibvirt.FilePolicy(src)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: overlay, BackingPool: e.pool, BackingVolume: used}); err != nil {
		t.Fatal(err)
	}
	uses, err := e.c.ImageUses(ctx, isImage)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]virt.VolumeRef{}
	for _, u := range uses {
		if u.Volume.AllocationBytes == 0 || u.Partial {
			t.Errorf("%s: allocation %d, partial %t", u.Volume.Name, u.Volume.AllocationBytes, u.Partial)
		}
		got[u.Volume.Name] = u.Users
	}
	if len(got) != 2 || len(got[used]) != 1 || got[used][0] != (virt.VolumeRef{Pool: e.pool, Name: overlay}) || len(got[unused]) != 0 {
		t.Fatalf("ImageUses = %+v", uses)
	}
	if err := e.c.DeleteUnusedImage(ctx, e.pool, used, isImage, nil); !errors.Is(err, virt.ErrImageInUse) {
		t.Errorf("deleting the used image: want ErrImageInUse, got %v", err)
	}
	if err := e.c.DeleteUnusedImage(ctx, e.pool, overlay, isImage, nil); err == nil {
		t.Error("deleted a volume that is not an image")
	}
	if err := e.c.DeleteUnusedImage(ctx, e.pool, unused, isImage, nil); err != nil {
		t.Fatal(err)
	}
	e.assertNoVolume(t, unused)
	for _, vol := range []string{used, overlay} {
		if _, err := e.c.VolumeInfo(ctx, e.pool, vol); err != nil {
			t.Errorf("%s: %v", vol, err)
		}
	}
}
