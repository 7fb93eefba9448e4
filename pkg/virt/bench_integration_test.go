package virt_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// msPerOp reports the mean of total over b.N operations in milliseconds,
// the unit the figures use.
func msPerOp(b *testing.B, total time.Duration, unit string) {
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), unit)
}

// BenchmarkEnsureOverlay creates overlays on a 2 GiB and a 20 GiB base; the
// two figures must match, since an overlay never copies its base.
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
