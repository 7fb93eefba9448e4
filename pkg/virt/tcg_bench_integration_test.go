package virt_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// tcgBenchEnv turns BenchmarkTCGGuestCPU on (`make bench-tcg`): it boots a
// guest per CPU model, minutes each under TCG.
const tcgBenchEnv = "CAPL_BENCH_TCG"

// tcgCPU is a guest CPU to compare under TCG.
type tcgCPU struct {
	name, mode, model string
	features          []string
}

// tcgCPUs are the candidates: everything TCG can emulate (maximum, the
// default), and plainer models whose CPUID sends Go's runtime, crypto and
// OpenSSL down code paths TCG translates more cheaply (no AVX, AVX2 or
// AVX-512, whose TCG helpers work lane by lane).
var tcgCPUs = []tcgCPU{
	{name: "maximum", mode: virt.CPUModeMaximum},
	{name: "qemu64", mode: virt.CPUModeCustom, model: "qemu64"},
	{name: "qemu64+sse4.2,popcnt,aes", mode: virt.CPUModeCustom, model: "qemu64",
		features: []string{"ssse3", "sse4.1", "sse4.2", "popcnt", "aes", "pclmuldq"}},
	{name: "Nehalem", mode: virt.CPUModeCustom, model: "Nehalem"},
	{name: "Westmere", mode: virt.CPUModeCustom, model: "Westmere"},
}

// BenchmarkTCGGuestCPU boots the test image under TCG once per CPU model
// and measures inside the guest what the model changes: time from start to
// the guest agent answering (kernel and userspace boot), and the
// throughput of the work Kubernetes' Go binaries do (testdata/tcgbench:
// TLS handshakes, SHA-256, AES-GCM, JSON, gzip, memmove) and of OpenSSL.
// Each figure is a metric of the model's sub-benchmark; run it with
// -benchtime=1x.
func BenchmarkTCGGuestCPU(b *testing.B) {
	if os.Getenv(tcgBenchEnv) == "" {
		b.Skipf("boots a guest per CPU model for minutes each; set %s=1 (make bench-tcg)", tcgBenchEnv)
	}
	bench := buildTCGBench(b)
	img := testlibvirt.Image(b)
	e := newStorageEnv(b)
	ctx := testCtxWithin(b, time.Hour)
	base, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: e.pool + "-base.qcow2", Source: img, Policy: testlibvirt.FilePolicy(img), SHA256: fileSHA(b, img)})
	if err != nil {
		b.Fatal(err)
	}
	for i, cpu := range tcgCPUs {
		b.Run(cpu.name, func(b *testing.B) {
			for range b.N {
				name := e.pool + "-cpu" + strconv.Itoa(i)
				disk, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: name + ".qcow2", BackingPool: e.pool, BackingVolume: base.Name})
				if err != nil {
					b.Fatal(err)
				}
				spec := virt.DomainSpec{
					Name: name, UUID: uuid.NewString(),
					Owner: virt.Owner{Kind: "LibvirtMachine", Namespace: "capltest", Name: name, UID: uuid.NewString(), Cluster: e.pool},
					Type:  virt.DomainTypeQEMU, CPUMode: cpu.mode, CPUModel: cpu.model, CPUFeatures: cpu.features,
					VCPUs: 1, MemoryMiB: 1024, TCGCacheMiB: 256,
					DiskPath: disk.Path, DiskBackingPath: disk.BackingPath, DiskBackingFormat: disk.BackingFormat,
				}
				runTCGGuest(ctx, b, e, spec, bench)
				if err := e.c.DeleteVolume(ctx, e.pool, disk.Name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// runTCGGuest boots spec, runs the workloads in it, reports their figures
// and deletes the domain.
func runTCGGuest(ctx context.Context, b *testing.B, e storageEnv, spec virt.DomainSpec, bench []byte) {
	b.Helper()
	defer func() {
		if err := e.c.DeleteDomain(context.Background(), spec.Name); err != nil {
			b.Error(err)
		}
	}()
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := e.c.StartDomain(ctx, spec.Name); err != nil {
		b.Fatal(err)
	}
	for {
		_, err := e.c.GuestExec(ctx, spec.Name, "/bin/true", nil, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, virt.ErrAgentUnavailable) || ctx.Err() != nil {
			b.Fatalf("waiting for the guest agent: %v", err)
		}
		time.Sleep(2 * time.Second)
	}
	b.ReportMetric(time.Since(start).Seconds(), "s-to-agent")
	// The boot's own work (cloud-init, timers) settles before measuring.
	time.Sleep(20 * time.Second)

	if err := e.c.GuestWriteFile(ctx, spec.Name, "/root/tcgbench", bench, 0o755); err != nil {
		b.Fatal(err)
	}
	out := guestRun(ctx, b, e, spec.Name, "/root/tcgbench", "-d", "5s")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			b.Fatalf("tcgbench printed %q", line)
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(v, f[0]+"-"+f[2])
	}
	// OpenSSL picks its code paths by CPUID too; 16 KiB blocks.
	for _, alg := range []string{"aes-128-gcm", "sha256"} {
		out := guestRun(ctx, b, e, spec.Name, "openssl", "speed", "-seconds", "3", "-bytes", "16384", "-evp", alg)
		b.ReportMetric(opensslKBps(b, out, alg)/1000, "openssl-"+alg+"-MB/s")
	}
	b.ReportMetric(guestCPUFlags(ctx, b, e, spec.Name), "cpu-flags")
}

func guestRun(ctx context.Context, b *testing.B, e storageEnv, domain, path string, args ...string) string {
	b.Helper()
	res, err := e.c.GuestExec(ctx, domain, path, args, nil)
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("%s %v: exit %d, %v: %s", path, args, res.ExitCode, err, res.Stderr)
	}
	return string(res.Stdout)
}

// opensslKBps reads the throughput of alg from `openssl speed -bytes N`'s
// last line ("alg  12345.67k").
func opensslKBps(b *testing.B, out, alg string) float64 {
	b.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.EqualFold(f[0], alg) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(f[len(f)-1], "k"), 64)
			if err == nil {
				return v
			}
		}
	}
	b.Fatalf("no %s figure in openssl's output:\n%s", alg, out)
	return 0
}

// guestCPUFlags is the number of CPU flags the guest kernel sees, to show
// that the model took effect.
func guestCPUFlags(ctx context.Context, b *testing.B, e storageEnv, domain string) float64 {
	out := guestRun(ctx, b, e, domain, "/bin/sh", "-c", "grep -m1 '^flags' /proc/cpuinfo")
	return float64(len(strings.Fields(out)) - 2)
}

// buildTCGBench compiles testdata/tcgbench for the guest: static, so it
// runs on any distribution.
func buildTCGBench(b *testing.B) []byte {
	b.Helper()
	out := filepath.Join(b.TempDir(), "tcgbench")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./testdata/tcgbench")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building tcgbench: %v: %s", err, msg)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		b.Fatal(err)
	}
	return data
}
