package virt_test

import (
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

func TestEnsurePoolTwice(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	path := filepath.Join(testlibvirt.PoolRoot, e.pool)
	if err := e.c.EnsurePool(ctx, virt.PoolSpec{Name: e.pool, Path: path}); err != nil {
		t.Fatalf("second EnsurePool: %v", err)
	}
	if err := e.c.EnsurePool(ctx, virt.PoolSpec{Name: e.pool, Path: path + "-elsewhere"}); err == nil {
		t.Fatal("EnsurePool with another path succeeded")
	}
	if st, err := os.Stat(path); err != nil || !st.IsDir() {
		t.Fatalf("pool directory: %v", err)
	}
}

func TestImportImageLocalFile(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	tests := []struct {
		name       string
		file       func() (string, string)
		wantFormat string
		wantCap    uint64
	}{
		{"raw spanning several chunks", func() (string, string) { return randomFile(t, 2*int(mib)+12345) }, virt.FormatRaw, 2*mib + 12345},
		{"qcow2 probed after upload", func() (string, string) { return qcow2File(t, gib) }, virt.FormatQCOW2, gib},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, sum := tt.file()
			vol := e.volName(t, "img"+strconv.Itoa(i))
			info, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: src, Policy: testlibvirt.FilePolicy(src), SHA256: sum})
			if err != nil {
				t.Fatal(err)
			}
			if info.Format != tt.wantFormat || info.CapacityBytes != tt.wantCap {
				t.Errorf("got format %s capacity %d, want %s %d", info.Format, info.CapacityBytes, tt.wantFormat, tt.wantCap)
			}
			if got := fileSHA(t, info.Path); got != sum {
				t.Errorf("volume content sha256 %s, want %s", got, sum)
			}
			e.assertNoVolume(t, vol+".partial")
		})
	}
}

func TestImportImageHTTP(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	src, sum := randomFile(t, 3*int(mib))
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/image.raw" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		http.ServeFile(w, r, src)
	}))
	t.Cleanup(srv.Close)

	vol := e.volName(t, "http")
	img := virt.ImageImport{Pool: e.pool, Volume: vol, Source: srv.URL + "/image.raw", SHA256: sum}
	info, err := e.c.ImportImage(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if got := fileSHA(t, info.Path); got != sum {
		t.Errorf("volume content sha256 %s, want %s", got, sum)
	}
	if _, err := e.c.ImportImage(ctx, img); err != nil {
		t.Fatalf("second import: %v", err)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("source fetched %d times, want once", n)
	}

	missing := img
	missing.Volume, missing.Source = e.volName(t, "missing"), srv.URL+"/nope"
	if _, err := e.c.ImportImage(ctx, missing); !errors.Is(err, virt.ErrImageNotFound) {
		t.Errorf("404 source: want ErrImageNotFound, got %v", err)
	}
	e.assertNoVolume(t, missing.Volume)
	e.assertNoVolume(t, missing.Volume+".partial")
}

func TestImportImageErrors(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	src, sum := randomFile(t, int(mib)+1)
	wrong := sha256Hex([]byte("something else"))
	tests := []struct {
		name    string
		source  string
		sha     string
		wantErr error
	}{
		{"checksum mismatch", src, wrong, virt.ErrChecksumMismatch},
		{"missing local file", src + ".absent", sum, virt.ErrImageNotFound},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vol := e.volName(t, "bad"+strconv.Itoa(i))
			_, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: tt.source, Policy: testlibvirt.FilePolicy(tt.source), SHA256: tt.sha})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("want %v, got %v", tt.wantErr, err)
			}
			e.assertNoVolume(t, vol)
			e.assertNoVolume(t, vol+".partial")
		})
	}
}

// A crash mid-import leaves the volume and its .partial marker; neither
// EnsureOverlay nor the next import may trust that volume.
func TestImportImageCrashLeftoverNotReused(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	src, sum := qcow2File(t, gib)
	vol := e.volName(t, "crash")
	if _, err := e.c.UploadVolume(ctx, e.pool, vol+".partial", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.UploadVolume(ctx, e.pool, vol, []byte("half an image")); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: e.volName(t, "ov"), BackingPool: e.pool, BackingVolume: vol})
	if !errors.Is(err, virt.ErrImageNotFound) {
		t.Fatalf("overlay on incomplete base: want ErrImageNotFound, got %v", err)
	}
	info, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: src, Policy: testlibvirt.FilePolicy(src), SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	if got := fileSHA(t, info.Path); got != sum {
		t.Errorf("leftover reused: content sha256 %s, want %s", got, sum)
	}
	e.assertNoVolume(t, vol+".partial")
}

func TestEnsureOverlayCapacity(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	base := e.importBase(t, e.pool+"-base", gib)
	overlay := virt.OverlaySpec{Pool: e.pool, Name: e.pool + "-overlay", BackingPool: e.pool, BackingVolume: base.Name}
	steps := []struct {
		name      string
		requested uint64
		want      uint64
	}{
		{"none asked gets the base's size", 0, gib},
		{"larger than base", 2 * gib, 2 * gib},
		{"never shrinks", gib, 2 * gib},
		{"grows", 3 * gib, 3 * gib},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			overlay.CapacityBytes = s.requested
			info, err := e.c.EnsureOverlay(ctx, overlay)
			if err != nil {
				t.Fatal(err)
			}
			qi := imgInfo(t, info.Path)
			if info.CapacityBytes != s.want || qi.VirtualSize != s.want {
				t.Errorf("capacity libvirt %d, qemu-img %d, want %d", info.CapacityBytes, qi.VirtualSize, s.want)
			}
			if qi.Format != "qcow2" || qi.FormatSpecific.Data.Compat != "1.1" || qi.BackingFilename != base.Path || qi.BackingFormat != "qcow2" {
				t.Errorf("overlay is %+v, want qcow2 compat 1.1 backed by %s (qcow2)", qi, base.Path)
			}
		})
	}
	small := overlay
	small.Name, small.CapacityBytes = e.pool+"-small", 512*mib
	if _, err := e.c.EnsureOverlay(ctx, small); !errors.Is(err, virt.ErrImageLargerThanDisk) {
		t.Errorf("disk smaller than its base: want ErrImageLargerThanDisk, got %v", err)
	}
	e.assertNoVolume(t, small.Name)
	missing := overlay
	missing.Name, missing.BackingVolume = e.pool+"-ov2", e.pool+"-nobase"
	if _, err := e.c.EnsureOverlay(ctx, missing); !errors.Is(err, virt.ErrImageNotFound) {
		t.Errorf("missing base: want ErrImageNotFound, got %v", err)
	}
	// The overlay twice: deleting a missing volume is success.
	for _, v := range []string{overlay.Name, overlay.Name, base.Name} {
		if err := e.c.DeleteVolume(ctx, e.pool, v); err != nil {
			t.Errorf("DeleteVolume %s: %v", v, err)
		}
	}
	e.assertNoVolume(t, overlay.Name)
	if err := e.c.DeleteVolume(ctx, e.pool+"-nopool", "x"); err != nil {
		t.Errorf("DeleteVolume in missing pool: %v", err)
	}
}

func TestUploadVolumeSecretMode(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	name := e.pool + "-seed.iso"
	data := make([]byte, 64<<10)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{len(data), len(data), len(data) / 2} { // create, rewrite, resize
		info, err := e.c.UploadVolume(ctx, e.pool, name, data[:size])
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(info.Path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 || st.Size() != int64(size) {
			t.Errorf("file %s: mode %v size %d, want 0600 and %d", info.Path, st.Mode().Perm(), st.Size(), size)
		}
		if got := fileSHA(t, info.Path); got != sha256Hex(data[:size]) {
			t.Errorf("content differs")
		}
	}
	if mode := volumeXMLMode(t, e.uri, e.pool, name); mode != "0600" {
		t.Errorf("volume XML mode %q, want 0600", mode)
	}
}
