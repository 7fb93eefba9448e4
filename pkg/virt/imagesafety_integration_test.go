package virt_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// hostSecret is a root-owned 0600 file outside every pool, standing for
// what a hostile image would like the host to open: another tenant's seed,
// /etc/shadow, a block device.
type hostSecret struct {
	path string
	st   syscall.Stat_t
}

func newHostSecret(t *testing.T) hostSecret {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "capltest-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Traversable, as /var/tmp itself is: only the file's own mode and
	// owner keep QEMU out, and dynamic ownership would change both.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "secret.raw")
	if err := os.WriteFile(p, bytes.Repeat([]byte("secret"), 1<<16), 0o600); err != nil {
		t.Fatal(err)
	}
	s := hostSecret{path: p}
	if err := syscall.Stat(p, &s.st); err != nil {
		t.Fatal(err)
	}
	return s
}

// assertUntouched fails t when the secret's owner or mode changed: libvirt's
// dynamic ownership hands every file of a disk chain to the QEMU user.
func (s hostSecret) assertUntouched(t *testing.T) {
	t.Helper()
	var now syscall.Stat_t
	if err := syscall.Stat(s.path, &now); err != nil {
		t.Fatal(err)
	}
	if now.Uid != s.st.Uid || now.Gid != s.st.Gid || now.Mode != s.st.Mode {
		t.Errorf("%s changed hands: uid %d gid %d mode %o, was %d %d %o", s.path, now.Uid, now.Gid, now.Mode, s.st.Uid, s.st.Gid, s.st.Mode)
	}
}

// qemuImg runs qemu-img create and returns the file it made and its sha256.
func qemuImg(t *testing.T, name string, args ...string) (string, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	out, err := exec.Command("qemu-img", append(append([]string{"create", "-q"}, args...), p, "64M")...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img create %v: %v: %s", args, err, out)
	}
	return p, fileSHA(t, p)
}

// TestImportRefusesImagesThatNameHostFiles: a qcow2 whose header names a
// backing file or an external data file on the host, and formats that can
// name files, are refused before anything reaches the pool, the named file
// keeps its owner, and the refusal says why. With the old import the qcow2
// was stored, libvirt probed it, and QEMU later opened the secret.
func TestImportRefusesImagesThatNameHostFiles(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	secret := newHostSecret(t)
	dataFile := filepath.Join(t.TempDir(), "data.raw")
	tests := []struct {
		name    string
		file    func() (string, string)
		wantErr error
	}{
		{"backing file on the host", func() (string, string) {
			return qemuImg(t, "backed.qcow2", "-f", "qcow2", "-u", "-b", secret.path, "-F", "raw")
		}, virt.ErrImageHasBackingFile},
		{"external data file", func() (string, string) {
			return qemuImg(t, "datafile.qcow2", "-f", "qcow2", "-o", "data_file="+dataFile)
		}, virt.ErrImageHasDataFile},
		{"vmdk", func() (string, string) { return qemuImg(t, "disk.vmdk", "-f", "vmdk") }, virt.ErrImageFormatUnsupported},
		{"qed naming a backing file", func() (string, string) {
			return qemuImg(t, "backed.qed", "-f", "qed", "-u", "-b", secret.path, "-F", "raw")
		}, virt.ErrImageFormatUnsupported},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, sum := tt.file()
			vol := e.volName(t, "refused"+strconv.Itoa(i))
			_, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: src, SHA256: sum, Policy: testlibvirt.FilePolicy(src)})
			if !errors.Is(err, tt.wantErr) || !virt.IsImageRefused(err) {
				t.Fatalf("want %v, got %v", tt.wantErr, err)
			}
			e.assertNoVolume(t, vol)
			e.assertNoVolume(t, vol+".partial")
			secret.assertUntouched(t)
		})
	}
}

// plantBacked puts a qcow2 whose header names secret as its backing file
// into the pool, past the import's checks, as an operator (or anything
// with the pool's directory) could.
func (e storageEnv) plantBacked(t *testing.T, name string, secret hostSecret) virt.VolumeInfo {
	t.Helper()
	src, _ := qemuImg(t, "backed.qcow2", "-f", "qcow2", "-u", "-b", secret.path, "-F", "raw")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.c.UploadVolume(testCtx(t), e.pool, e.volName(t, name), b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.DeleteVolume(context.Background(), e.pool, info.Name) })
	return info
}

// TestEnsureOverlayRefusesChainedBase: a base volume nobody imported (an
// operator's image pool) whose header names a host file gets no overlay.
func TestEnsureOverlayRefusesChainedBase(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	secret := newHostSecret(t)
	base := e.plantBacked(t, "planted", secret).Name
	overlay := e.volName(t, "ov")
	_, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: overlay, BackingPool: e.pool, BackingVolume: base, CapacityBytes: gib})
	if !errors.Is(err, virt.ErrImageHasBackingFile) {
		t.Fatalf("want ErrImageHasBackingFile, got %v", err)
	}
	e.assertNoVolume(t, overlay)
	secret.assertUntouched(t)
}

// TestDomainPinsDiskChain: a domain whose disk is a qcow2 naming a host
// file as its backing file runs without QEMU opening that file, because
// the domain XML ends the chain; libvirt neither chowns the file nor
// puts it on QEMU's command line. Without the pin (the domain XML before
// this check) libvirt probed the header and did both.
func TestDomainPinsDiskChain(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	secret := newHostSecret(t)
	disk := e.plantBacked(t, "planted-disk", secret)
	name := e.pool + "-pinned"
	spec := virt.DomainSpec{
		Name: name, UUID: uuid.NewString(), Owner: virt.Owner{Kind: "LibvirtMachine", Namespace: "test", Name: "pinned", UID: uuid.NewString()},
		Type: virt.DomainTypeQEMU, CPUMode: virt.CPUModeMaximum, VCPUs: 1, MemoryMiB: 64, TCGCacheMiB: 16,
		DiskPath: disk.Path, DiskFormat: virt.FormatQCOW2,
	}
	t.Cleanup(func() { _ = e.c.DeleteDomain(context.Background(), name) })
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := e.c.StartDomain(ctx, name); err != nil {
		t.Fatal(err)
	}
	cmdline := qemuCommandLine(t, name)
	if strings.Contains(cmdline, secret.path) {
		t.Errorf("QEMU's command line names %s:\n%s", secret.path, cmdline)
	}
	secret.assertUntouched(t)
	if err := e.c.DeleteDomain(ctx, name); err != nil {
		t.Fatal(err)
	}
	secret.assertUntouched(t)
}

// qemuCommandLine is the running QEMU process of domain, read from the
// pid file libvirt keeps (the test runs on the libvirt host).
func qemuCommandLine(t *testing.T, domain string) string {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", domain+".pid"))
	if err != nil {
		t.Fatalf("QEMU pid of %s: %v", domain, err)
	}
	b, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(pid)), "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// TestImportBoundsDownloads: a server without Content-Length is read up to
// the bound and its image imported; an endless one and one announcing
// more than the bound are stopped; a redirect to a denied address and a
// file outside the allowed directories are refused; a wrong checksum does
// not reveal what the source hashed to. Nothing of a refused import
// stays in the pool.
func TestImportBoundsDownloads(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	good, goodSum := randomFile(t, 3*int(mib)+4321)
	content, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			// Written in pieces with flushes: no Content-Length.
			for off := 0; off < len(content); off += 256 << 10 {
				_, _ = w.Write(content[off:min(off+256<<10, len(content))])
				w.(http.Flusher).Flush()
			}
		case "/endless":
			buf := make([]byte, 1<<20)
			for r.Context().Err() == nil {
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
		case "/lying":
			w.Header().Set("Content-Length", strconv.FormatInt(1<<40, 10))
			_, _ = w.Write(content)
		case "/redirect":
			http.Redirect(w, r, "http://127.0.0.2:"+r.URL.Query().Get("port")+"/chunked", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	policy := virt.SourcePolicy{MaxBytes: 8 * int64(mib), DenyNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}
	outsidePolicy := virt.SourcePolicy{FileDirs: []string{t.TempDir()}}
	wrong := sha256Hex([]byte("not the image"))
	tests := []struct {
		name    string
		source  string
		sha     string
		policy  virt.SourcePolicy
		wantErr error
	}{
		{"no Content-Length, under the bound", srv.URL + "/chunked", goodSum, policy, nil},
		{"endless body", srv.URL + "/endless", wrong, policy, virt.ErrImageTooLarge},
		{"lying Content-Length", srv.URL + "/lying", goodSum, policy, virt.ErrImageTooLarge},
		{"redirect to a denied address", srv.URL + "/redirect?port=" + port, goodSum, policy, virt.ErrImageSourceRefused},
		{"file outside the allowed directories", "file://" + good, goodSum, outsidePolicy, virt.ErrImageSourceRefused},
		{"file:// with no directory allowed", "file://" + good, goodSum, virt.SourcePolicy{}, virt.ErrImageSourceRefused},
		{"wrong checksum", "file://" + good, wrong, testlibvirt.FilePolicy(good), virt.ErrChecksumMismatch},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vol := e.volName(t, "bound"+strconv.Itoa(i))
			start := time.Now()
			info, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: tt.source, SHA256: tt.sha, Policy: tt.policy})
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if info.CapacityBytes != uint64(len(content)) || fileSHA(t, info.Path) != goodSum {
					t.Errorf("imported %d bytes (sha256 %s), want %d (%s)", info.CapacityBytes, fileSHA(t, info.Path), len(content), goodSum)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("want %v, got %v", tt.wantErr, err)
			}
			if strings.Contains(err.Error(), goodSum) && tt.sha != goodSum {
				t.Errorf("the error reveals the source's digest: %v", err)
			}
			t.Logf("refused in %s: %v", time.Since(start).Round(time.Millisecond), err)
			e.assertNoVolume(t, vol)
			e.assertNoVolume(t, vol+".partial")
		})
	}
}
