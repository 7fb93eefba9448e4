package virt_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// msPerOp reports the mean of total over b.N operations in milliseconds,
// a readable unit for operations that take tens to thousands of them.
func msPerOp(b *testing.B, total time.Duration, unit string) {
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), unit)
}

// BenchmarkEnsureOverlay creates overlays on a 2 GiB and a 20 GiB base; the
// two figures must match, since an overlay never copies its base
// (TestOverlayCostIndependentOfBaseSize checks that they do).
func BenchmarkEnsureOverlay(b *testing.B) {
	for _, size := range []uint64{2 * gib, 20 * gib} {
		b.Run(fmt.Sprintf("base=%dGiB", size/gib), func(b *testing.B) {
			e := newStorageEnv(b)
			ctx := testCtx(b)
			base := e.importBase(b, e.pool+"-base", size)
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				name := e.pool + "-ov" + strconv.Itoa(i)
				start := time.Now()
				info, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: name, BackingPool: e.pool, BackingVolume: base.Name})
				total += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if info.CapacityBytes != size {
					b.Fatalf("overlay capacity %d, want %d", info.CapacityBytes, size)
				}
				b.StopTimer()
				if err := e.c.DeleteVolume(ctx, e.pool, name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			msPerOp(b, total, "ms/overlay")
		})
	}
}

// TestOverlayCostIndependentOfBaseSize checks the claim of
// BenchmarkEnsureOverlay as a ratio, so that it holds on a slow or busy
// host: overlays on a 2 GiB and a 20 GiB base, each holding data in
// proportion to its size (as a real image does), must take the same time to
// create and the same space on disk, within a tolerance. An overlay that
// copied or preallocated its base would cost ten times as much on the
// larger one.
func TestOverlayCostIndependentOfBaseSize(t *testing.T) {
	const (
		rounds = 7
		// maxTimeRatio bounds the slower base's fastest creation over the
		// other's: generous, because the host is shared; a copy of the
		// 20 GiB base's 160 MiB costs several times more than the 2 GiB
		// base's 16 MiB.
		maxTimeRatio = 2.0
		// maxSpaceRatio bounds the overlays' allocations: both are a few
		// hundred KiB of qcow2 metadata.
		maxSpaceRatio = 1.5
	)
	e := newStorageEnv(t)
	ctx := testCtxWithin(t, 5*time.Minute)
	sizes := []uint64{2 * gib, 20 * gib}
	bases := make([]virt.VolumeInfo, len(sizes))
	for i, size := range sizes {
		src, sum := qcow2WithData(t, size, 8*mib)
		var err error
		bases[i], err = e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: e.volName(t, fmt.Sprintf("base%d", i)), Source: src, Policy: testlibvirt.FilePolicy(src), SHA256: sum})
		if err != nil {
			t.Fatal(err)
		}
	}
	times := make([][]time.Duration, len(sizes))
	space := make([]uint64, len(sizes))
	for r := range rounds {
		for i, base := range bases { // interleaved, so both see the same load
			name := e.volName(t, fmt.Sprintf("ov%d-%d", i, r))
			start := time.Now()
			info, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: name, BackingPool: e.pool, BackingVolume: base.Name})
			times[i] = append(times[i], time.Since(start))
			if err != nil {
				t.Fatal(err)
			}
			space[i] = max(space[i], allocatedBytes(t, info.Path))
			if err := e.c.DeleteVolume(ctx, e.pool, name); err != nil {
				t.Fatal(err)
			}
		}
	}
	fastest := []time.Duration{slices.Min(times[0]), slices.Min(times[1])}
	t.Logf("fastest overlay creation: %v on %d GiB, %v on %d GiB; allocated %d and %d bytes",
		fastest[0], sizes[0]/gib, fastest[1], sizes[1]/gib, space[0], space[1])
	if r := ratio(float64(fastest[0]), float64(fastest[1])); r > maxTimeRatio {
		t.Errorf("creating an overlay takes %.1f times as long on one base as on the other (%v vs %v; tolerance %.1f): it depends on the base's size",
			r, fastest[0], fastest[1], maxTimeRatio)
	}
	if r := ratio(float64(space[0]), float64(space[1])); r > maxSpaceRatio {
		t.Errorf("an overlay takes %.1f times the space on one base as on the other (%d vs %d bytes; tolerance %.1f): it depends on the base's size",
			r, space[0], space[1], maxSpaceRatio)
	}
}

// ratio is the larger of a and b over the smaller.
func ratio(a, b float64) float64 {
	return max(a, b) / max(min(a, b), 1)
}

// allocatedBytes is the space the file at path takes on disk, read from
// the file system rather than from libvirt.
func allocatedBytes(t testing.TB, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(fi.Sys().(*syscall.Stat_t).Blocks) * 512
}

// qcow2WithData creates a qcow2 image of the given virtual size holding
// perGiB bytes of data for each GiB, in 1 MiB runs spread over the whole
// disk, and returns its path and sha256.
func qcow2WithData(t testing.TB, virtualSize, perGiB uint64) (string, string) {
	t.Helper()
	p, _ := qcow2File(t, virtualSize)
	runs := virtualSize / gib * (perGiB / mib)
	args := []string{"-f", "qcow2"}
	for i := range runs {
		args = append(args, "-c", fmt.Sprintf("write -q -P %d %d 1M", i%250+1, i*(virtualSize/runs)))
	}
	if out, err := exec.Command("qemu-io", append(args, p)...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	return p, fileSHA(t, p)
}

// BenchmarkUploadISO64KiB builds a NoCloud ISO around 64 KiB of user-data
// in memory and uploads it as a 0600 volume, reporting both halves.
func BenchmarkUploadISO64KiB(b *testing.B) {
	e := newStorageEnv(b)
	ctx := testCtx(b)
	userData := append([]byte("#cloud-config\n"), bytes.Repeat([]byte("# padding line of user-data\n"), 64<<10/28)...)
	var build, upload time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		iso, err := cloudinit.BuildISO(cloudinit.Seed{InstanceID: uuid.NewString(), LocalHostname: "bench", UserData: userData})
		if err != nil {
			b.Fatal(err)
		}
		built := time.Now()
		if _, err := e.c.UploadVolume(ctx, e.pool, e.pool+"-seed.iso", iso); err != nil {
			b.Fatal(err)
		}
		build, upload = build+built.Sub(start), upload+time.Since(built)
		b.SetBytes(int64(len(iso)))
	}
	msPerOp(b, build, "ms/build")
	msPerOp(b, upload, "ms/upload")
}

// BenchmarkImportImage imports the test image (a real qcow2 base, about
// 140 MiB) into a fresh volume each round; the figure includes reading the
// volume back to check libvirt wrote every byte.
func BenchmarkImportImage(b *testing.B) {
	e := newStorageEnv(b)
	ctx := testCtx(b)
	src := testlibvirt.Image(b)
	sum := fileSHA(b, src)
	st, err := os.Stat(src)
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		vol := e.pool + "-img" + strconv.Itoa(i)
		start := time.Now()
		_, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: vol, Source: src, Policy: testlibvirt.FilePolicy(src), SHA256: sum})
		total += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(st.Size())
		b.StopTimer()
		if err := e.c.DeleteVolume(ctx, e.pool, vol); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	msPerOp(b, total, "ms/import")
}

// BenchmarkDefineStart defines and starts a small TCG domain; destroying
// and undefining it is not timed.
func BenchmarkDefineStart(b *testing.B) {
	e := newStorageEnv(b)
	ctx := testCtx(b)
	tmpl := e.lifecycleSpec(b)
	var define, start time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		spec := tmpl
		spec.UUID = uuid.NewString()
		t0 := time.Now()
		if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := e.c.StartDomain(ctx, spec.Name); err != nil {
			b.Fatal(err)
		}
		define, start = define+t1.Sub(t0), start+time.Since(t1)
		b.StopTimer()
		if err := e.c.DeleteDomain(context.Background(), spec.Name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	msPerOp(b, define, "ms/define")
	msPerOp(b, start, "ms/start")
}
