package virt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

// storageEnv is one client and one fresh test pool.
type storageEnv struct {
	uri  string
	c    *virt.Client
	pool string
}

func newStorageEnv(t testing.TB) storageEnv {
	t.Helper()
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	return storageEnv{uri: uri, c: c, pool: testlibvirt.Pool(t, uri, c)}
}

func testCtx(t testing.TB) context.Context {
	return testCtxWithin(t, 2*time.Minute)
}

// testCtxWithin is a context that ends after d or with t.
func testCtxWithin(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// randomFile writes n random bytes to a temp file and returns its path and
// sha256.
func randomFile(t testing.TB, n int) (string, string) {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "image.raw")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, sha256Hex(b)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// qcow2File creates an empty qcow2 image of the given virtual size: a tiny
// file that stands for a base image of that size.
func qcow2File(t testing.TB, virtualSize uint64) (string, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "base.qcow2")
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, strconv.FormatUint(virtualSize, 10)).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, sha256Hex(b)
}

func fileSHA(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256Hex(b)
}

func (e storageEnv) volName(_ testing.TB, suffix string) string {
	return e.pool + "-" + suffix
}

func (e storageEnv) assertNoVolume(t *testing.T, name string) {
	t.Helper()
	_, err := e.c.VolumeInfo(testCtx(t), e.pool, name)
	if !virt.IsNotFound(err) {
		t.Errorf("volume %s: want not found, got %v", name, err)
	}
}

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

// qemuImgInfo is the part of `qemu-img info --output=json` the tests check.
type qemuImgInfo struct {
	VirtualSize     uint64 `json:"virtual-size"`
	Format          string `json:"format"`
	BackingFilename string `json:"backing-filename"`
	BackingFormat   string `json:"backing-filename-format"`
	FormatSpecific  struct {
		Data struct {
			Compat string `json:"compat"`
		} `json:"data"`
	} `json:"format-specific"`
}

func imgInfo(t testing.TB, path string) qemuImgInfo {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	return info
}

// importBase imports an empty qcow2 base of the given virtual size.
func (e storageEnv) importBase(t testing.TB, name string, virtualSize uint64) virt.VolumeInfo {
	t.Helper()
	src, sum := qcow2File(t, virtualSize)
	info, err := e.c.ImportImage(testCtx(t), virt.ImageImport{Pool: e.pool, Volume: name, Source: src, Policy: testlibvirt.FilePolicy(src), SHA256: sum})
	if err != nil {
		t.Fatal(err)
	}
	return info
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

// volumeXMLMode reads a volume's permission mode from libvirt directly.
func volumeXMLMode(t *testing.T, uri, pool, name string) string {
	t.Helper()
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p, err := conn.LookupStoragePoolByName(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free()
	v, err := p.LookupStorageVolByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Free()
	doc, err := v.GetXMLDesc(0)
	if err != nil {
		t.Fatal(err)
	}
	var vx libvirtxml.StorageVolume
	if err := vx.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	if vx.Target == nil || vx.Target.Permissions == nil {
		return ""
	}
	return vx.Target.Permissions.Mode
}

// TestPoolFull imports into a pool on a 1 MiB tmpfs: the upload hits
// ENOSPC, which must surface as ErrPoolFull and leave no volume behind.
// libvirt reports the ENOSPC itself when its writer fails while data is
// still being sent, and drops it when the writer fails after the last
// Send (seen in CI under load, about 1 run in 30 here with the cores
// busy); the read-back after the upload must catch that case too.
func TestPoolFull(t *testing.T) {
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	ctx := testCtx(t)
	name := testlibvirt.Name(t)
	path := filepath.Join(testlibvirt.PoolRoot, name)
	if err := os.Mkdir(path, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "capltest", path).CombinedOutput(); err != nil {
		testprereq.Missing(t, "cannot mount a tmpfs here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", path).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", path, err, out)
		}
	})
	t.Cleanup(func() {
		if err := testlibvirt.DestroyPool(uri, name); err != nil {
			t.Errorf("cleaning up pool %s: %v", name, err)
		}
	})
	if err := c.EnsurePool(ctx, virt.PoolSpec{Name: name, Path: path}); err != nil {
		t.Fatal(err)
	}
	src, sum := randomFile(t, 3*int(mib))
	vol := name + "-big"
	_, err := c.ImportImage(ctx, virt.ImageImport{Pool: name, Volume: vol, Source: src, Policy: testlibvirt.FilePolicy(src), SHA256: sum})
	if !errors.Is(err, virt.ErrPoolFull) {
		t.Fatalf("want ErrPoolFull, got %v", err)
	}
	t.Logf("full pool: %v", err)
	for _, v := range []string{vol, vol + ".partial"} {
		if _, err := c.VolumeInfo(ctx, name, v); !virt.IsNotFound(err) {
			t.Errorf("volume %s: want not found, got %v", v, err)
		}
	}
}

// TestDeletePool: a pool holding a volume is kept; once empty it goes with
// its directory, and deleting it again is success.
func TestDeletePool(t *testing.T) {
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	ctx := testCtx(t)
	name := testlibvirt.Name(t)
	path := filepath.Join(testlibvirt.PoolRoot, name)
	t.Cleanup(func() {
		if err := testlibvirt.DestroyPool(uri, name); err != nil {
			t.Errorf("cleaning up pool %s: %v", name, err)
		}
	})
	if err := c.EnsurePool(ctx, virt.PoolSpec{Name: name, Path: path}); err != nil {
		t.Fatal(err)
	}
	vol := name + "-vol"
	if _, err := c.UploadVolume(ctx, name, vol, []byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePool(ctx, name); !errors.Is(err, virt.ErrPoolNotEmpty) {
		t.Fatalf("deleting a pool with a volume: want ErrPoolNotEmpty, got %v", err)
	}
	if _, err := c.VolumeInfo(ctx, name, vol); err != nil {
		t.Fatalf("the refused delete must leave the pool serving its volume: %v", err)
	}
	if err := c.DeleteVolume(ctx, name, vol); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := c.DeletePool(ctx, name); err != nil {
			t.Fatalf("delete %d of the empty pool: %v", i+1, err)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("pool directory %s: want removed, got %v", path, err)
	}
	if _, err := c.VolumeInfo(ctx, name, vol); !virt.IsNotFound(err) {
		t.Errorf("volume lookup in the deleted pool: want not found, got %v", err)
	}
}

// TestLogVolume: a console log volume is made empty and 0600, kept with
// what was logged into it, and deleted with the files virtlogd rotated
// out of it, which the pool had not listed.
func TestLogVolume(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	name := e.volName(t, "vm-console.log")
	info, err := e.c.EnsureLogVolume(ctx, e.pool, name)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(info.Path); err != nil || st.Size() != 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("log volume %s: %v, %v", info.Path, st, err)
	}
	logged := []byte("kubeadm join … --token abcdef.0123456789abcdef\n")
	f, err := os.OpenFile(info.Path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(logged)
	f.Close()
	if err := os.WriteFile(info.Path+".0", logged, 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := e.c.EnsureLogVolume(ctx, e.pool, name)
	if err != nil || again.Path != info.Path {
		t.Fatalf("second EnsureLogVolume: %+v, %v", again, err)
	}
	if b, _ := os.ReadFile(info.Path); string(b) != string(logged) {
		t.Errorf("the log was reset: %q", b)
	}
	for i := 0; i < 2; i++ { // deleting twice: the second finds nothing
		if err := e.c.DeleteLogVolume(ctx, e.pool, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{info.Path, info.Path + ".0"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s outlived DeleteLogVolume: %v", p, err)
		}
	}
}

// TestReadVolume reads a volume's first bytes back through a libvirt
// stream: all of a short one, the asked prefix of a longer one.
func TestReadVolume(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	vol := e.volName(t, "read")
	data := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB, more than one stream chunk
	if _, err := e.c.UploadVolume(ctx, e.pool, vol, data); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int64{1, 4096, int64(len(data)), int64(len(data)) + 100} {
		got, err := e.c.ReadVolume(ctx, e.pool, vol, limit)
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		if want := data[:min(limit, int64(len(data)))]; !bytes.Equal(got, want) {
			t.Errorf("limit %d: read %d bytes, want the volume's first %d", limit, len(got), len(want))
		}
	}
	if _, err := e.c.ReadVolume(ctx, e.pool, e.volName(t, "missing"), 10); !virt.IsNotFound(err) {
		t.Errorf("missing volume: %v, want not found", err)
	}
}
