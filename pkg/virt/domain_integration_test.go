package virt_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// lifecycleSpec is a tiny TCG domain on an empty overlay: it boots nothing,
// which is all a lifecycle test needs.
func (e storageEnv) lifecycleSpec(t testing.TB) virt.DomainSpec {
	t.Helper()
	ctx := testCtx(t)
	base := e.importBase(t, e.pool+"-base", 64*mib)
	disk, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: e.pool + "-disk", BackingPool: e.pool, BackingVolume: base.Name})
	if err != nil {
		t.Fatal(err)
	}
	seed, err := e.c.UploadVolume(ctx, e.pool, e.pool+"-seed.iso", make([]byte, 64<<10))
	if err != nil {
		t.Fatal(err)
	}
	name := e.pool + "-vm"
	// As the domain service does: the console logs to a pool volume.
	log, err := e.c.EnsureLogVolume(ctx, e.pool, name+"-console.log")
	if err != nil {
		t.Fatal(err)
	}
	logPath := log.Path
	spec := virt.DomainSpec{
		Name:        name,
		UUID:        uuid.NewString(),
		Owner:       virt.Owner{Kind: "LibvirtMachine", Namespace: "test", Name: "vm", UID: uuid.NewString(), Cluster: e.pool},
		Type:        virt.DomainTypeQEMU,
		CPUMode:     virt.CPUModeMaximum,
		VCPUs:       1,
		MemoryMiB:   64,
		TCGCacheMiB: 16,
		DiskPath:    disk.Path, DiskBackingPath: disk.BackingPath, DiskBackingFormat: disk.BackingFormat,
		SeedISOPath:    seed.Path,
		ConsoleLogPath: logPath,
	}
	t.Cleanup(func() {
		if err := e.c.DeleteDomain(context.Background(), name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return spec
}

// waitEvent returns the first event of kind for uuid, failing t after 30s.
func waitEvent(t *testing.T, events <-chan virt.Event, kind virt.EventKind, id string) virt.Event {
	t.Helper()
	return waitEventWithin(t, events, kind, id, 30*time.Second)
}

// waitEventWithin returns the first event of kind for uuid, failing t after
// wait.
func waitEventWithin(t *testing.T, events <-chan virt.Event, kind virt.EventKind, id string, wait time.Duration) virt.Event {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("event channel closed waiting for %s", kind)
			}
			if ev.Kind == kind && ev.UUID == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event for %s within %v", kind, id, wait)
		}
	}
}

func TestDomainLifecycle(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	spec := e.lifecycleSpec(t)
	events := e.c.Subscribe(ctx)

	info, err := e.c.EnsureDomain(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if info.UUID != spec.UUID || info.State != "shutoff" || info.VCPUs != 1 || info.MemoryMiB != 64 || info.Owner == nil || *info.Owner != spec.Owner {
		t.Fatalf("after define: %+v (owner %+v)", info, info.Owner)
	}
	if again, err := e.c.EnsureDomain(ctx, spec); err != nil || again.UUID != spec.UUID {
		t.Fatalf("second EnsureDomain: %+v, %v", again, err)
	}
	assertOwned(t, e.c, virt.OwnedObject{Kind: virt.OwnedDomain, Name: spec.Name, Owner: &spec.Owner})
	assertOwned(t, e.c, virt.OwnedObject{Kind: virt.OwnedVolume, Name: e.pool + "-disk", Pool: e.pool})

	t.Run("name taken by another UUID", func(t *testing.T) {
		other := spec
		other.UUID = uuid.NewString()
		_, err := e.c.EnsureDomain(ctx, other)
		var replaced *virt.DomainReplacedError
		if !errors.As(err, &replaced) || replaced.ActualUUID != spec.UUID {
			t.Fatalf("want DomainReplacedError naming %s, got %v", spec.UUID, err)
		}
	})
	t.Run("UUID taken by another name", func(t *testing.T) {
		other := spec
		other.Name = spec.Name + "-other"
		if _, err := e.c.EnsureDomain(ctx, other); !errors.Is(err, virt.ErrDomainReplaced) {
			t.Fatalf("want ErrDomainReplaced, got %v", err)
		}
	})

	for i := 0; i < 2; i++ { // starting a running domain is success
		if err := e.c.StartDomain(ctx, spec.Name); err != nil {
			t.Fatalf("StartDomain #%d: %v", i+1, err)
		}
	}
	started := waitEvent(t, events, virt.EventDomainStarted, spec.UUID)
	if started.Domain != spec.Name || started.Owner == nil || *started.Owner != spec.Owner {
		t.Errorf("started event %+v, owner %+v", started, started.Owner)
	}
	if info, err := e.c.DomainInfo(ctx, spec.Name); err != nil || info.State != "running" {
		t.Fatalf("after start: %+v, %v", info, err)
	}
	if st, err := os.Stat(spec.ConsoleLogPath); err != nil {
		t.Errorf("console log: %v", err)
	} else {
		t.Logf("console log %s: %d bytes, mode %v", spec.ConsoleLogPath, st.Size(), st.Mode())
	}

	// Nothing inside answers ACPI, so this exercises the destroy fallback.
	begin := time.Now()
	if err := e.c.ShutdownDomain(ctx, spec.Name, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > 15*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	stopped := waitEvent(t, events, virt.EventDomainStopped, spec.UUID)
	if stopped.Detail != "destroyed" {
		t.Errorf("stopped detail %q, want destroyed", stopped.Detail)
	}
	if info, err := e.c.DomainInfo(ctx, spec.Name); err != nil || info.State != "shutoff" {
		t.Fatalf("after shutdown: %+v, %v", info, err)
	}
	if err := e.c.ShutdownDomain(ctx, spec.Name, time.Second); err != nil {
		t.Errorf("shutting down a stopped domain: %v", err)
	}

	if err := e.c.StartDomain(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // deleting twice: the second finds nothing
		if err := e.c.DeleteDomain(ctx, spec.Name); err != nil {
			t.Fatalf("DeleteDomain #%d of a running domain: %v", i+1, err)
		}
	}
	undefined := waitEvent(t, events, virt.EventDomainUndefined, spec.UUID)
	if undefined.Owner == nil || *undefined.Owner != spec.Owner {
		t.Errorf("undefined event lacks the owner: %+v", undefined)
	}
	if _, err := e.c.DomainInfo(ctx, spec.Name); !virt.IsNotFound(err) {
		t.Errorf("DomainInfo after delete: want not found, got %v", err)
	}
	if err := e.c.ShutdownDomain(ctx, spec.Name, time.Second); err != nil {
		t.Errorf("shutting down a missing domain: %v", err)
	}
}

func TestStartDomainFailureCarriesLibvirtMessage(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	spec := e.lifecycleSpec(t)
	spec.DiskPath = "/var/lib/libvirt/" + testlibvirt.Name(t) + "-absent.qcow2"
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	err := e.c.StartDomain(ctx, spec.Name)
	var startErr *virt.DomainStartError
	if !errors.As(err, &startErr) || !errors.Is(err, virt.ErrDomainStart) || startErr.Message == "" {
		t.Fatalf("want DomainStartError with libvirt's message, got %v", err)
	}
	t.Logf("libvirt says: %s", startErr.Message)
}

// assertOwned fails t unless ListOwned reports want.
func assertOwned(t *testing.T, h virt.Host, want virt.OwnedObject) {
	t.Helper()
	objs, err := h.ListOwned(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Kind == want.Kind && o.Name == want.Name && o.Pool == want.Pool &&
			(want.Owner == nil) == (o.Owner == nil) && (o.Owner == nil || *o.Owner == *want.Owner) {
			return
		}
	}
	t.Errorf("ListOwned lacks %+v", want)
}
