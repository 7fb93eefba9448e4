package virt_test

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestGuestAgent boots the test image without network or seed and drives
// every guest-agent call, starting from the agent-connected event. Under
// TCG the agent comes up 1-2 minutes after start.
func TestGuestAgent(t *testing.T) {
	testlibvirt.SoakOnly(t, "the e2e reads every guest's product_uuid and runs ip in it through the agent, and the provider reads the bootstrap sentinel with it")
	img := testlibvirt.Image(t)
	e := newStorageEnv(t)
	ctx := testCtxWithin(t, 12*time.Minute)

	base, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: e.pool + "-base.qcow2", Source: img, Policy: testlibvirt.FilePolicy(img), SHA256: fileSHA(t, img)})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: e.pool + "-disk.qcow2", BackingPool: e.pool, BackingVolume: base.Name})
	if err != nil {
		t.Fatal(err)
	}
	name := e.pool + "-agent"
	logPath := virt.DefaultConsoleLogPath(name)
	spec := virt.DomainSpec{
		Name: name, UUID: uuid.NewString(),
		Owner: virt.Owner{Kind: "LibvirtMachine", Namespace: "capltest", Name: name, UID: uuid.NewString(), Cluster: e.pool},
		Type:  virt.DomainTypeQEMU, CPUMode: virt.CPUModeMaximum, VCPUs: 1, MemoryMiB: 512, TCGCacheMiB: 128,
		DiskPath: disk.Path, DiskBackingPath: disk.BackingPath, DiskBackingFormat: disk.BackingFormat, ConsoleLogPath: logPath,
	}
	t.Cleanup(func() {
		if err := e.c.DeleteDomain(ctx, name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		_ = os.Remove(logPath)
	})
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.GuestReadFile(ctx, name, "/etc/hostname"); !errors.Is(err, virt.ErrAgentUnavailable) {
		t.Fatalf("agent of a stopped domain: want ErrAgentUnavailable, got %v", err)
	}
	events := e.c.Subscribe(ctx)
	start := time.Now()
	if err := e.c.StartDomain(ctx, name); err != nil {
		t.Fatal(err)
	}
	waitEventWithin(t, events, virt.EventAgentConnected, spec.UUID, 8*time.Minute)
	t.Logf("start → agent connected: %v", time.Since(start).Round(time.Second))

	t.Run("exec", func(t *testing.T) {
		res, err := e.c.GuestExec(ctx, name, "/bin/sh", []string{"-c", "cat; echo oops >&2; exit 3"}, []byte("hello"))
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 3 || string(res.Stdout) != "hello" || string(res.Stderr) != "oops\n" {
			t.Errorf("got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("write then read", func(t *testing.T) {
		data := bytes.Repeat([]byte("frontend fe\n"), 20_000) // 240 kB: several chunks each way
		path := "/tmp/capl-agent-test.cfg"
		if err := e.c.GuestWriteFile(ctx, name, path, data, 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := e.c.GuestReadFile(ctx, name, path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("read back %d bytes, wrote %d", len(got), len(data))
		}
		res, err := e.c.GuestExec(ctx, name, "stat", []string{"-c", "%a", path}, nil)
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "640" {
			t.Errorf("mode: %q, %v", res.Stdout, err)
		}
		if _, err := e.c.GuestReadFile(ctx, name, path+".capl-tmp"); !virt.IsNotFound(err) {
			t.Errorf("temporary file left behind: %v", err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		if _, err := e.c.GuestReadFile(ctx, name, "/run/cluster-api/absent"); !virt.IsNotFound(err) {
			t.Errorf("want not found, got %v", err)
		}
	})
	t.Run("interfaces", func(t *testing.T) {
		ifaces, err := e.c.GuestInterfaces(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range ifaces {
			for _, a := range i.Addresses {
				if i.Name == "lo" && a == netip.MustParsePrefix("127.0.0.1/8") {
					return
				}
			}
		}
		t.Errorf("no lo 127.0.0.1/8 in %+v", ifaces)
	})
}
