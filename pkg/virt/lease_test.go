package virt

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// fakeLeases is a lease table per network that counts the reads and the
// poll loops the watcher runs.
type fakeLeases struct {
	mu      sync.Mutex
	leases  map[string][]dhcpLease
	reads   map[string]int
	loops   atomic.Int32 // currently running
	started atomic.Int32 // ever started
	events  chan Event
	wg      sync.WaitGroup
}

func newFakeLeases() *fakeLeases {
	return &fakeLeases{leases: map[string][]dhcpLease{}, reads: map[string]int{}, events: make(chan Event, 16)}
}

func (f *fakeLeases) set(network string, l ...dhcpLease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases[network] = l
}

func (f *fakeLeases) watcher(ctx context.Context) *leaseWatcher {
	fetch := func(_ context.Context, network string) ([]dhcpLease, error) {
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
	return newLeaseWatcher(5*time.Millisecond, fetch, func(ev Event) { f.events <- ev }, start)
}

func (f *fakeLeases) next(t *testing.T) Event {
	t.Helper()
	select {
	case ev := <-f.events:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no lease event")
		return Event{}
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
	w.watch(ctx, "net1", "52:54:00:00:00:01")
	w.watch(ctx, "net1", "52:54:00:00:00:02")
	w.watch(ctx, "net1", "52:54:00:00:00:02") // a second waiter for the same MAC
	w.watch(ctx, "net2", "52:54:00:00:00:03")
	if got := f.started.Load(); got != 2 {
		t.Fatalf("%d poll loops started, want one per network", got)
	}

	// A lease that exists already is reported on the first poll; upper-case
	// and expired entries are handled.
	f.set("net1",
		dhcpLease{MAC: "52:54:00:00:00:02", IP: netip.MustParseAddr("10.0.0.2"), Expiry: time.Now().Add(-time.Minute)},
		dhcpLease{MAC: "52:54:00:00:00:0A", IP: netip.MustParseAddr("10.0.0.9")},
		dhcpLease{MAC: "52:54:00:00:00:01", IP: netip.MustParseAddr("10.0.0.5")},
	)
	ev := f.next(t)
	want := Event{Kind: EventLease, Network: "net1", MAC: "52:54:00:00:00:01", IP: "10.0.0.5", Detail: LeaseAcquired}
	if ev != want {
		t.Fatalf("event %+v, want %+v", ev, want)
	}
	f.set("net1", dhcpLease{MAC: "52:54:00:00:00:02", IP: netip.MustParseAddr("10.0.0.6")})
	if ev := f.next(t); ev.MAC != "52:54:00:00:00:02" || ev.IP != "10.0.0.6" {
		t.Fatalf("event %+v", ev)
	}
	// Both waiters for :02 are satisfied by one event; net1's loop ends.
	eventually(t, "net1's loop to end", func() bool { return f.loops.Load() == 1 })
	select {
	case ev := <-f.events:
		t.Fatalf("unexpected event %+v", ev)
	default:
	}
	f.set("net2", dhcpLease{MAC: "52:54:00:00:00:03", IP: netip.MustParseAddr("10.1.0.2")})
	f.next(t)
	eventually(t, "all loops to end", func() bool { return f.loops.Load() == 0 })
	f.wg.Wait()
}

func TestLeaseWatcherStopsWhenWaitersGiveUp(t *testing.T) {
	f := newFakeLeases()
	w := f.watcher(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	w.watch(ctx, "net1", "52:54:00:00:00:01")
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
	w.watch(context.Background(), "net1", "52:54:00:00:00:01")
	if f.started.Load() != 2 {
		t.Errorf("started %d loops, want 2", f.started.Load())
	}
}

func TestLeaseWatcherAlreadyCancelledContext(t *testing.T) {
	f := newFakeLeases()
	w := f.watcher(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.watch(ctx, "net1", "52:54:00:00:00:01")
	eventually(t, "the loop to end", func() bool { return f.loops.Load() == 0 })
	f.wg.Wait()
}

func TestLeaseWatcherOwnerShutdown(t *testing.T) {
	f := newFakeLeases()
	owner, shutdown := context.WithCancel(context.Background())
	w := f.watcher(owner)
	w.watch(context.Background(), "net1", "52:54:00:00:00:01")
	shutdown()
	f.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.nets) != 0 {
		t.Errorf("watch state left after shutdown: %v", w.nets)
	}
}

func TestNetworkAddresses(t *testing.T) {
	now := time.Now()
	mac := netalloc.MAC("52:54:00:00:00:0a")
	leases := []dhcpLease{
		{MAC: netalloc.CanonicalMAC("52:54:00:00:00:0A"), IP: netip.MustParseAddr("10.0.0.5"), Hostname: "debian", Expiry: now.Add(time.Hour)},
		{MAC: mac, IP: netip.MustParseAddr("fe80::5054:ff:fe00:a")},
		{MAC: mac, IP: netip.MustParseAddr("10.0.0.4"), Expiry: now.Add(-time.Hour)},
		{MAC: "52:54:00:00:00:0b", IP: netip.MustParseAddr("10.0.0.6")},
	}
	tests := []struct {
		name  string
		hosts []Reservation
		want  []Address
	}{
		{"lease confirms the reservation", []Reservation{{MAC: mac, IP: netip.MustParseAddr("10.0.0.5"), Hostname: "cp-0"}},
			[]Address{{IP: netip.MustParseAddr("10.0.0.5"), Source: AddressSourceLease, Hostname: "debian"}}},
		{"reservation not leased yet", []Reservation{{MAC: mac, IP: netip.MustParseAddr("10.0.0.9"), Hostname: "cp-0"}},
			[]Address{{IP: netip.MustParseAddr("10.0.0.5"), Source: AddressSourceLease, Hostname: "debian"},
				{IP: netip.MustParseAddr("10.0.0.9"), Source: AddressSourceReservation, Hostname: "cp-0"}}},
		{"no reservation", nil, []Address{{IP: netip.MustParseAddr("10.0.0.5"), Source: AddressSourceLease, Hostname: "debian"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := networkAddresses(leases, tt.hosts, mac, now)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestAgentAddresses(t *testing.T) {
	ifaces := []GuestInterface{
		{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128")}},
		{Name: "ens3", MAC: netalloc.CanonicalMAC("52:54:00:AA:00:01"), Addresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.20/24"), netip.MustParsePrefix("fe80::1/64"), netip.MustParsePrefix("2001:db8::20/64")}},
		{Name: "cni0", MAC: "52:54:00:aa:00:02", Addresses: []netip.Prefix{netip.MustParsePrefix("10.244.0.1/24")}},
	}
	got := agentAddresses(ifaces, "52:54:00:aa:00:01")
	want := []Address{{IP: netip.MustParseAddr("192.168.1.20"), Source: AddressSourceAgent}, {IP: netip.MustParseAddr("2001:db8::20"), Source: AddressSourceAgent}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %v, want %v", got, want)
	}
	if all := agentAddresses(ifaces, ""); len(all) != 3 {
		t.Errorf("without MAC got %v, want every non-loopback global address", all)
	}
}
