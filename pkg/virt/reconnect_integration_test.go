package virt_test

import (
	"os"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestReconnectAfterLibvirtdRestart kills libvirtd under a live Client and
// starts it again; the Client must reconnect by itself, without a call
// (a manager at rest makes none, and the reconnect event is what makes it
// look at its objects again), the next call must succeed and event
// callbacks must be registered again. The outage lasts only the restart
// itself, and the test returns once libvirtd answers again, so the tests
// that run after it (a package's tests run one at a time) find it serving.
func TestReconnectAfterLibvirtdRestart(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	spec := e.lifecycleSpec(t)
	events := e.c.Subscribe(ctx)

	restartLibvirtd(t)

	begin := time.Now()
	waitEvent(t, events, virt.EventReconnected, "")
	t.Logf("reconnected without a call %v after the restart", time.Since(begin).Round(time.Millisecond))
	info, err := e.c.VolumeInfo(ctx, e.pool, e.pool+"-disk")
	if err != nil {
		t.Fatalf("first call after the restart: %v", err)
	}
	t.Logf("first call after the reconnect succeeded (%s)", info.Name)

	// Lifecycle callbacks were registered again on the new connection.
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, events, virt.EventDomainDefined, spec.UUID); ev.Owner == nil || *ev.Owner != spec.Owner {
		t.Errorf("defined event after reconnect: %+v", ev)
	}
	if err := e.c.DeleteDomain(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, virt.EventDomainUndefined, spec.UUID)
}

// restartLibvirtd stops the running libvirtd and starts a new one the way
// this host runs it, without waiting for its socket: reconnecting is the
// Client's job.
func restartLibvirtd(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(testlibvirt.LibvirtdPidFile); err != nil {
		testprereq.Missing(t, "no libvirtd pid file (%v): cannot restart libvirtd here (hack/prepare-host.sh starts libvirtd -d, which writes it)", err)
	}
	if _, err := testlibvirt.StopLibvirtd(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := testlibvirt.StartLibvirtd(); err != nil {
		t.Fatal(err)
	}
}
