package virt_test

import (
	"bufio"
	"context"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
)

// TestHostMemoryMatchesMeminfo compares libvirtd's idea of the host's
// memory with the kernel's, when libvirtd runs on this machine.
func TestHostMemoryMatchesMeminfo(t *testing.T) {
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c.HostMemory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got == 0 {
		t.Fatal("HostMemory() = 0")
	}
	t.Logf("libvirt host memory: %d bytes (%.1f GiB)", got, float64(got)/(1<<30))
	again, err := c.HostMemory(ctx)
	if err != nil || again != got {
		t.Fatalf("second HostMemory() = %d, %v; want %d", again, err, got)
	}
	if u, err := url.Parse(uri); err != nil || u.Hostname() != "" {
		testprereq.Missing(t, "libvirt at %s may be another machine: /proc/meminfo says nothing about it (the test needs a local libvirtd)", uri)
	}
	want := memTotal(t)
	// Both read MemTotal; the margin only allows libvirt's rounding.
	if diff := max(got, want) - min(got, want); diff > want/100 {
		t.Errorf("HostMemory() = %d bytes, /proc/meminfo MemTotal = %d bytes", got, want)
	}
}

// memTotal reads MemTotal from /proc/meminfo, in bytes.
func memTotal(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 3 && fields[0] == "MemTotal:" && fields[2] == "kB" {
			kib, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib << 10
		}
	}
	t.Fatalf("no MemTotal in /proc/meminfo (%v)", sc.Err())
	return 0
}
