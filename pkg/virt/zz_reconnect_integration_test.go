package virt_test

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// libvirtdPidfile is where `libvirtd -d` records its pid when run as root.
const libvirtdPidfile = "/run/libvirtd.pid"

// TestReconnectAfterLibvirtdRestart kills libvirtd under a live Client and
// starts it again; the next call on the same Client must succeed and event
// callbacks must be registered again. It lives in the file that sorts last
// so the outage, which other users of this libvirtd notice, comes after
// every other test, and it keeps the outage to the restart itself.
func TestReconnectAfterLibvirtdRestart(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	spec := e.lifecycleSpec(t)
	events := e.c.Subscribe(ctx)

	restartLibvirtd(t)

	begin := time.Now()
	info, err := e.c.VolumeInfo(ctx, e.pool, e.pool+"-disk")
	if err != nil {
		t.Fatalf("first call after the restart: %v", err)
	}
	t.Logf("first call after restart succeeded in %v (%s)", time.Since(begin).Round(time.Millisecond), info.Name)
	waitEvent(t, events, virt.EventReconnected, "")

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

// restartLibvirtd stops the running libvirtd by its pid and starts a new
// one the way this host runs it (`libvirtd -d`), without waiting for its
// socket: reconnecting is the Client's job.
func restartLibvirtd(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(libvirtdPidfile)
	if err != nil {
		t.Skipf("no libvirtd pidfile (%v): cannot restart libvirtd here", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pidfile %s: %v", libvirtdPidfile, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stopping libvirtd %d: %v", pid, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			break
		}
		if stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(stat), ") Z ") {
			break // exited; a zombie until someone reaps it
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirtd %d did not exit within 30s", pid)
		}
	}
	if out, err := exec.Command("libvirtd", "-d").CombinedOutput(); err != nil {
		t.Fatalf("starting libvirtd: %v: %s", err, out)
	}
}
