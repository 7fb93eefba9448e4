package virt

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The test:///default driver runs in-process: these tests need no libvirtd
// yet exercise the connection, event and metadata plumbing for real.
const testURI = "test:///default"

func dialTest(t *testing.T) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, testURI)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func nextEvent(t *testing.T, events <-chan Event, kind EventKind) Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("events closed while waiting for %s", kind)
			}
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event", kind)
		}
	}
}

func TestClientEventsAndOwnerWithTestDriver(t *testing.T) {
	c := dialTest(t)
	ctx := context.Background()
	events := c.Subscribe(ctx)
	spec := baseSpec()
	spec.Type, spec.CPUMode = DomainTypeQEMU, CPUModeMaximum
	spec.SeedISOPath, spec.Network, spec.ConsoleLogPath = "", "", ""

	info, err := c.EnsureDomain(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner == nil || *info.Owner != spec.Owner || info.State != "shutoff" {
		t.Fatalf("defined: %+v", info)
	}
	if err := c.StartDomain(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	started := nextEvent(t, events, EventDomainStarted)
	if started.Domain != spec.Name || started.Owner == nil || *started.Owner != spec.Owner {
		t.Errorf("started event %+v", started)
	}

	// The owner comes from the domain's metadata, not only from the cache
	// EnsureDomain filled.
	c.forgetOwner(info.UUID)
	objs, err := c.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].Kind != OwnedDomain || objs[0].Owner == nil || *objs[0].Owner != spec.Owner {
		t.Errorf("ListOwned = %+v", objs)
	}

	if err := c.DeleteDomain(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events, EventDomainUndefined); ev.Owner == nil || *ev.Owner != spec.Owner {
		t.Errorf("undefined event %+v", ev)
	}
	if err := c.DeleteDomain(ctx, spec.Name); err != nil {
		t.Errorf("second delete: %v", err)
	}
}

func TestClientClose(t *testing.T) {
	c := dialTest(t)
	events := c.Subscribe(context.Background())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, open := <-events; open {
		t.Error("subscription still open after Close")
	}
	if _, err := c.DomainInfo(context.Background(), "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("call after Close: want ErrClosed, got %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSubscribeEndsWithContext(t *testing.T) {
	c := dialTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	events := c.Subscribe(ctx)
	cancel()
	select {
	case _, open := <-events:
		if open {
			t.Error("got an event instead of the channel closing")
		}
	case <-time.After(5 * time.Second):
		t.Error("subscription not closed after its context ended")
	}
}

func TestDialGivesUpWithinBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	_, err := Dial(ctx, "qemu+unix:///system?socket=/nonexistent/libvirt-sock", WithReconnectBudget(300*time.Millisecond))
	if err == nil {
		t.Fatal("Dial to a missing socket succeeded")
	}
	if d := time.Since(begin); d > 3*time.Second {
		t.Errorf("Dial took %v despite a 300ms budget", d)
	}
}

// TestReleasedConnectionOutlivesItsCalls declares the connection dead over
// and over while calls run on it: each drop releases it (in the
// background) and reconnects, and a call still using the released
// connection must not find it freed under it (libvirt frees a connection
// at its last reference, and its calls take none). Without the reference
// withConn holds, libvirt logged use of freed connections in every run
// and the test binary crashed with SIGSEGV in one run of three.
func TestReleasedConnectionOutlivesItsCalls(t *testing.T) {
	c := dialTest(t)
	ctx := context.Background()
	stop := make(chan struct{})
	done := make(chan struct{})
	calls := 0
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = c.DomainInfo(ctx, "test")
			_, _ = c.ListOwned(ctx)
			calls++
		}
	}()
	drops := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); drops++ {
		c.mu.Lock()
		if c.cur != nil {
			c.cur.dead.Store(true)
		}
		c.mu.Unlock()
		if _, err := c.DomainInfo(ctx, "test"); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	t.Logf("%d drops under %d calls", drops, calls)
}

func TestDisplayURI(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"qemu+tls://kvm1/system?pkipath=%2Ftmp%2Fcapl-credentials-1", "qemu+tls://kvm1/system"},
		{"qemu+ssh://root@kvm1:2222/system?command=%2Ftmp%2Fx%2Fssh&no_tty=1", "qemu+ssh://root@kvm1:2222/system"},
		{"qemu:///system", "qemu:///system"},
	} {
		if got := displayURI(tc.uri); got != tc.want {
			t.Errorf("displayURI(%s) = %s; want %s", tc.uri, got, tc.want)
		}
	}
}

func TestTransportURI(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"qemu+libssh://root@kvm1/system?keyfile=/k", "qemu+libssh2://root@kvm1/system?keyfile=/k"},
		{"qemu+libssh2://root@kvm1/system", "qemu+libssh2://root@kvm1/system"},
		{"qemu+LIBSSH://root@kvm1/system", "qemu+libssh2://root@kvm1/system"},
		{"QEMU+LibSSH://kvm1/system", "qemu+libssh2://kvm1/system"},
		{"qemu+ssh://root@kvm1/system", "qemu+ssh://root@kvm1/system"},
		{"qemu:///system", "qemu:///system"},
	} {
		if got := transportURI(tc.uri); got != tc.want {
			t.Errorf("transportURI(%s) = %s; want %s", tc.uri, got, tc.want)
		}
	}
}
