package imageimport

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestBackoff(t *testing.T) {
	o := Options{MinBackoff: 10 * time.Second, MaxBackoff: time.Minute}
	for n, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 4: time.Minute, 30: time.Minute} {
		if got := o.Backoff(n); got != want {
			t.Errorf("Backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestProgress(t *testing.T) {
	for _, tc := range []struct {
		st   Status
		want string
	}{
		{Status{Elapsed: 2500 * time.Millisecond}, "waiting for the source to answer (3s so far)"},
		{Status{Read: 0, Total: 100, Elapsed: 500 * time.Millisecond}, "0 B of 100 B (0%)"},
		{Status{Read: 7, Total: 150 << 20, Elapsed: 7 * time.Second}, "7 B of 150.0 MiB (0%), 1 B/s"},
		{Status{Read: 75 << 20, Total: 150 << 20, Elapsed: 10 * time.Second}, "75.0 MiB of 150.0 MiB (50%), 7.5 MiB/s"},
		{Status{Read: 3 << 30, Total: 4 << 30, Elapsed: time.Minute}, "3.0 GiB of 4.0 GiB (75%), 51.2 MiB/s"},
	} {
		if got := tc.st.Progress(); got != tc.want {
			t.Errorf("Progress(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}

// gateHost's ImportImage reports progress, then waits for its outcome on
// a channel (or for its context to end).
type gateHost struct {
	fakehost.Host
	mu       sync.Mutex
	calls    int
	started  chan context.Context
	outcome  chan error
	canceled chan error
}

func newGateHost() *gateHost {
	return &gateHost{started: make(chan context.Context, 10), outcome: make(chan error, 10), canceled: make(chan error, 10)}
}

func (h *gateHost) ImportImage(ctx context.Context, img virt.ImageImport) (virt.VolumeInfo, error) {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	img.Progress(512, 1024)
	h.started <- ctx
	select {
	case err := <-h.outcome:
		return virt.VolumeInfo{Pool: img.Pool, Name: img.Volume}, err
	case <-ctx.Done():
		h.canceled <- ctx.Err()
		return virt.VolumeInfo{}, ctx.Err()
	}
}

func (h *gateHost) callCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

var (
	key = Key{Pool: "p", Volume: "capl-image-x", Source: "http://x/img", SHA256: "ab"}
	a   = Waiter{Kind: "LibvirtMachine", Namespace: "ns", Name: "a"}
	b   = Waiter{Kind: "LibvirtMachine", Namespace: "ns", Name: "b"}
)

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// waitPhase polls Ensure (as requeued reconciles would) until phase.
func waitPhase(t *testing.T, im *Importer, w Waiter, phase Phase) Status {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := im.Ensure(key, w)
		if st.Phase == phase {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want %s", st, phase)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSharedImportAndNotification(t *testing.T) {
	h := newGateHost()
	im := New(h, Options{})
	im.Source("LibvirtMachine")
	st := im.Ensure(key, a)
	recv(t, h.started, "import")
	if st.Phase != Running || st.Attempt != 1 {
		t.Fatalf("first Ensure = %+v", st)
	}
	if st := im.Ensure(key, b); st.Phase != Running || st.Read != 512 || st.Total != 1024 {
		t.Fatalf("second waiter sees %+v, want the running import's progress", st)
	}
	h.outcome <- nil
	got := map[string]bool{}
	ch := im.sources["LibvirtMachine"]
	for range 2 {
		got[recv(t, ch, "notification").Object.GetName()] = true
	}
	if !got["a"] || !got["b"] {
		t.Errorf("notified %v, want both waiters", got)
	}
	if st := im.Ensure(key, a); st.Phase != Done || st.Volume.Name != key.Volume {
		t.Errorf("after the import: %+v", st)
	}
	if n := h.callCount(); n != 1 {
		t.Errorf("%d imports for one image, want 1", n)
	}
}

func TestCancelledWhenNobodyWaits(t *testing.T) {
	h := newGateHost()
	im := New(h, Options{})
	im.Ensure(key, a)
	im.Ensure(key, b)
	recv(t, h.started, "import")
	im.Release(a)
	select {
	case <-h.canceled:
		t.Fatal("cancelled while b still waits")
	case <-time.After(50 * time.Millisecond):
	}
	im.Release(b)
	if err := recv(t, h.canceled, "cancellation"); !errors.Is(err, context.Canceled) {
		t.Errorf("import ended with %v, want context.Canceled", err)
	}
	if len(im.jobs) != 0 {
		t.Errorf("jobs left: %v", im.jobs)
	}
	// A new waiter starts afresh.
	if st := im.Ensure(key, a); st.Phase != Running || st.Attempt != 1 {
		t.Errorf("after cancellation: %+v", st)
	}
	recv(t, h.started, "new import")
	h.outcome <- nil
	waitPhase(t, im, a, Done)
}

func TestFailureBacksOff(t *testing.T) {
	h := newGateHost()
	im := New(h, Options{MinBackoff: time.Minute, MaxBackoff: time.Hour})
	now := time.Now()
	im.now = func() time.Time { return now }
	im.Ensure(key, a)
	recv(t, h.started, "import")
	h.outcome <- errors.New("timeout awaiting response headers")
	st := waitPhase(t, im, a, Failed)
	if st.Err == nil || !st.RetryAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("failed status %+v, want a retry in 1m", st)
	}
	if st := im.Ensure(key, a); st.Phase != Failed || h.callCount() != 1 {
		t.Errorf("retried during the backoff: %+v, %d calls", st, h.callCount())
	}
	now = now.Add(time.Minute)
	if st := im.Ensure(key, a); st.Phase != Running || st.Attempt != 2 {
		t.Errorf("after the backoff: %+v, want attempt 2 running", st)
	}
	recv(t, h.started, "retry")
	h.outcome <- errors.New("again")
	if st := waitPhase(t, im, a, Failed); !st.RetryAt.Equal(now.Add(2 * time.Minute)) {
		t.Errorf("second failure retries at %s, want in 2m", st.RetryAt.Sub(now))
	}
}

func TestDeadline(t *testing.T) {
	h := newGateHost()
	im := New(h, Options{Deadline: 50 * time.Millisecond})
	im.Ensure(key, a)
	recv(t, h.started, "import")
	st := waitPhase(t, im, a, Failed)
	if !errors.Is(st.Err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the deadline", st.Err)
	}
}

func TestStartCancelsImports(t *testing.T) {
	h := newGateHost()
	im := New(h, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- im.Start(ctx) }()
	im.Ensure(key, a)
	recv(t, h.started, "import")
	cancel()
	recv(t, h.canceled, "cancellation")
	recv(t, done, "Start's return")
}

// TestCollectorOptions: the collector does nothing with GCAfter zero and
// checks at least twice per grace period, at most every
// DefaultGCInterval.
func TestCollectorOptions(t *testing.T) {
	for _, tc := range []struct {
		after, interval, want time.Duration
	}{
		{0, 0, 0},
		{time.Minute, 0, 30 * time.Second},
		{24 * time.Hour, 0, DefaultGCInterval},
		{24 * time.Hour, time.Minute, time.Minute},
	} {
		if got := (Options{GCAfter: tc.after, GCInterval: tc.interval}).withDefaults().GCInterval; got != tc.want {
			t.Errorf("GCAfter %s, GCInterval %s: interval %s, want %s", tc.after, tc.interval, got, tc.want)
		}
	}
	// With GCAfter zero, Start returns at once: it never lists a host.
	if err := New(newGateHost(), Options{}).Collector().Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}
