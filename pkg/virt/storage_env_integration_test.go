package virt_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
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
