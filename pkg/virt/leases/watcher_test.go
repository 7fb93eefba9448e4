package leases

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeLeases is a lease table per network that counts the reads and the
// poll loops the watcher runs.
type fakeLeases struct {
	mu      sync.Mutex
	leases  map[string][]Lease
	reads   map[string]int
	loops   atomic.Int32 // currently running
	started atomic.Int32 // ever started
	found   chan found
	wg      sync.WaitGroup
}

func newFakeLeases() *fakeLeases {
	return &fakeLeases{leases: map[string][]Lease{}, reads: map[string]int{}, found: make(chan found, 16)}
}

func (f *fakeLeases) set(network string, l ...Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases[network] = l
}

func (f *fakeLeases) watcher(ctx context.Context) *Watcher {
	fetch := func(_ context.Context, network string) ([]Lease, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.reads[network]++
		return f.leases[network], nil
	}
	start := func(fn func(context.Context)) {
		f.loops.Add(1)
		f.started.Add(1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.loops.Add(-1)
			fn(ctx)
		}()
	}
	return NewWatcher(5*time.Millisecond, fetch, func(network string, l Lease) { f.found <- found{network, l} }, start)
}

// found is one call of the watcher's acquired.
type found struct {
	network string
	lease   Lease
}

func (f *fakeLeases) next(t *testing.T) found {
	t.Helper()
	select {
	case l := <-f.found:
		return l
	case <-time.After(5 * time.Second):
		t.Fatal("no lease reported")
		return found{}
	}
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLeaseWatcherOneLoopPerNetwork(t *testing.T) {
	f := newFakeLeases()
	w := f.watcher(context.Background())
	ctx := context.Background()
	w.Watch(ctx, "net1", "52:54:00:00:00:01")
	w.Watch(ctx, "net1", "52:54:00:00:00:02")
	w.Watch(ctx, "net1", "52:54:00:00:00:02") // a second waiter for the same MAC
	w.Watch(ctx, "net2", "52:54:00:00:00:03")
	if got := f.started.Load(); got != 2 {
		t.Fatalf("%d poll loops started, want one per network", got)
	}

	// A lease that exists already is reported on the first poll; upper-case
	// and expired entries are handled.
	f.set("net1",
		Lease{MAC: "52:54:00:00:00:02", IP: netip.MustParseAddr("10.0.0.2"), Expiry: time.Now().Add(-time.Minute)},
		Lease{MAC: "52:54:00:00:00:0A", IP: netip.MustParseAddr("10.0.0.9")},
		Lease{MAC: "52:54:00:00:00:01", IP: netip.MustParseAddr("10.0.0.5")},
	)
	got := f.next(t)
	want := found{"net1", Lease{MAC: "52:54:00:00:00:01", IP: netip.MustParseAddr("10.0.0.5")}}
	if got != want {
		t.Fatalf("reported %+v, want %+v", got, want)
	}
	f.set("net1", Lease{MAC: "52:54:00:00:00:02", IP: netip.MustParseAddr("10.0.0.6")})
	if got := f.next(t); got.lease.MAC != "52:54:00:00:00:02" || got.lease.IP.String() != "10.0.0.6" {
		t.Fatalf("reported %+v", got)
	}
	// Both waiters for :02 are satisfied by one event; net1's loop ends.
	eventually(t, "net1's loop to end", func() bool { return f.loops.Load() == 1 })
	select {
	case l := <-f.found:
		t.Fatalf("unexpected report %+v", l)
	default:
	}
	f.set("net2", Lease{MAC: "52:54:00:00:00:03", IP: netip.MustParseAddr("10.1.0.2")})
	f.next(t)
	eventually(t, "all loops to end", func() bool { return f.loops.Load() == 0 })
	f.wg.Wait()
}

func TestLeaseWatcherStopsWhenWaitersGiveUp(t *testing.T) {
	f := newFakeLeases()
	w := f.watcher(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	w.Watch(ctx, "net1", "52:54:00:00:00:01")
	eventually(t, "a few polls", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.reads["net1"] >= 3
	})
	cancel()
	eventually(t, "the loop to end", func() bool { return f.loops.Load() == 0 })
	f.mu.Lock()
	reads := f.reads["net1"]
	f.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reads["net1"] != reads {
		t.Error("leases still polled with nobody waiting")
	}

	// Watching again starts a fresh loop.
	w.Watch(context.Background(), "net1", "52:54:00:00:00:01")
	if f.started.Load() != 2 {
		t.Errorf("started %d loops, want 2", f.started.Load())
	}
}

func TestLeaseWatcherAlreadyCancelledContext(t *testing.T) {
	f := newFakeLeases()
	w := f.watcher(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Watch(ctx, "net1", "52:54:00:00:00:01")
	eventually(t, "the loop to end", func() bool { return f.loops.Load() == 0 })
	f.wg.Wait()
}

func TestLeaseWatcherOwnerShutdown(t *testing.T) {
	f := newFakeLeases()
	owner, shutdown := context.WithCancel(context.Background())
	w := f.watcher(owner)
	w.Watch(context.Background(), "net1", "52:54:00:00:00:01")
	shutdown()
	f.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.nets) != 0 {
		t.Errorf("watch state left after shutdown: %v", w.nets)
	}
}
