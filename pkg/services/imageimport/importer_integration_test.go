package imageimport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestMain asserts that nothing the tests created is left on the host.
func TestMain(m *testing.M) {
	os.Exit(testlibvirt.RunChecked(m))
}

// clock is a settable Importer clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// libvirtImporter is an Importer into a test pool of the real libvirtd,
// on a settable clock; it is stopped when t ends.
func libvirtImporter(t *testing.T, opts Options) (*Importer, *virt.Client, string, *clock) {
	t.Helper()
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	pool := testlibvirt.Pool(t, uri, c)
	im := New(c, opts)
	clk := &clock{now: time.Now()}
	im.now = clk.Now
	t.Cleanup(func() {
		im.cancel()
		im.wg.Wait()
	})
	return im, c, pool, clk
}

// waitEnd polls Ensure (as requeued reconciles would) until the import
// is no longer running.
func waitEnd(t *testing.T, im *Importer, key Key, w Waiter) Status {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := im.Ensure(key, w)
		if st.Phase != Running {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("import still running: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRefusedSourceNotFetchedAgain: an endless body for a 4 MiB disk is
// cut past the disk and refused; however long after, the same spec does
// not fetch it again, and the waiter's earlier import is left once its
// disk size changes, which fetches it once more. Before, the body was read
// to the operator's bound, the import failed, and every retry after the
// backoff fetched it again.
func TestRefusedSourceNotFetchedAgain(t *testing.T) {
	im, _, pool, clk := libvirtImporter(t, Options{MinBackoff: time.Second, MaxBackoff: time.Second,
		Sources: virt.SourcePolicy{MaxBytes: 64 << 20}})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		buf := bytes.Repeat([]byte{0x5a}, 1<<20)
		for r.Context().Err() == nil {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	key := Key{Pool: pool, Volume: pool + "-endless", Source: srv.URL + "/endless.raw",
		SHA256: hex.EncodeToString(make([]byte, sha256.Size)), DiskBytes: 4 << 20}

	st := waitEnd(t, im, key, a)
	if st.Phase != Refused || !errors.Is(st.Err, virt.ErrImageLargerThanDisk) {
		t.Errorf("endless body for a 4 MiB disk: %+v, want Refused with ErrImageLargerThanDisk", st)
	}
	if st.Read > 8<<20 {
		t.Errorf("read %d bytes for a 4 MiB disk", st.Read)
	}
	clk.Add(time.Hour) // far past any backoff
	if st := im.Ensure(key, a); st.Phase != Refused || st.Attempt != 1 {
		t.Errorf("an hour later: %+v, want still refused after 1 attempt", st)
	}
	if st := im.Ensure(key, b); st.Phase != Refused || st.Attempt != 1 {
		t.Errorf("another waiter of the same spec: %+v, want the refusal", st)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("source fetched %d times, want once", n)
	}

	larger := key
	larger.DiskBytes = 8 << 20
	im.Release(b)
	if st := im.Ensure(larger, a); st.Phase != Running || st.Attempt != 1 {
		t.Fatalf("after the disk size changed: %+v, want a new import", st)
	}
	if _, ok := im.jobs[key]; ok {
		t.Error("the import of the old spec still has waiters")
	}
	if st := waitEnd(t, im, larger, a); st.Phase != Refused {
		t.Errorf("8 MiB disk: %+v, want Refused", st)
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("source fetched %d times after one spec change, want twice", n)
	}
}

// importQCOW2 imports an empty qcow2 of virtual size into pool under the
// name the provider gives it, and returns that name.
func importQCOW2(t *testing.T, c *virt.Client, pool string, virtual int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, strconv.Itoa(virtual)).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	name := naming.ImageVolumeName(hex.EncodeToString(sum[:]))
	if _, err := c.ImportImage(context.Background(), virt.ImageImport{Pool: pool, Volume: name, Source: p,
		SHA256: hex.EncodeToString(sum[:]), Policy: testlibvirt.FilePolicy(p)}); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestUnusedImagesCollected: of four imported images, the one an overlay
// is backed by, the one a reconcile asked for and the one a reconcile
// names by spec.image.volume (Want) stay; the one nobody uses stays for
// the grace period and is removed on the first sweep after it. Before,
// imported images were never removed, and then an image named by
// spec.image.volume was removed as unused.
func TestUnusedImagesCollected(t *testing.T) {
	const grace = time.Hour
	im, c, pool, clk := libvirtImporter(t, Options{GCAfter: grace})
	im.gcPools = func(p string) bool { return p == pool } // the host is shared
	ctx := context.Background()
	used, unused, wanted := importQCOW2(t, c, pool, 1<<20), importQCOW2(t, c, pool, 2<<20), importQCOW2(t, c, pool, 3<<20)
	named := importQCOW2(t, c, pool, 4<<20)
	if _, err := c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: pool, Name: pool + "-overlay", BackingPool: pool, BackingVolume: used}); err != nil {
		t.Fatal(err)
	}
	exists := func(vol string) bool {
		_, err := c.VolumeInfo(ctx, pool, vol)
		if err != nil && !virt.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	// A reconcile asks for wanted now and then, as a machine waiting for
	// its import would.
	wantedKey := Key{Pool: pool, Volume: wanted, Source: "file:///nowhere", SHA256: "00"}
	unusedSince := map[imageRef]time.Time{}
	steps := []struct {
		advance time.Duration
		want    map[string]bool
	}{
		{0, map[string]bool{used: true, unused: true, wanted: true, named: true}},
		{grace - time.Second, map[string]bool{used: true, unused: true, wanted: true, named: true}},
		{2 * time.Second, map[string]bool{used: true, unused: false, wanted: true, named: true}},
		{2 * grace, map[string]bool{used: true, unused: false, wanted: true, named: true}},
	}
	for i, s := range steps {
		clk.Add(s.advance)
		im.Ensure(wantedKey, a)
		im.Want(c, pool, named)
		im.sweep(ctx, unusedSince)
		for vol, want := range s.want {
			if got := exists(vol); got != want {
				t.Errorf("step %d: %s exists: %t, want %t", i, vol, got, want)
			}
		}
	}
}

// askingStore is a host on which a reconcile asks for every image the
// collector is about to delete, after the sweep found it unused and
// before DeleteUnusedImage runs.
type askingStore struct {
	*virt.Client
	ask func(pool, name string)
}

func (s *askingStore) DeleteUnusedImage(ctx context.Context, pool, name string, isImage func(string) bool, keep func() bool) error {
	s.ask(pool, name)
	return s.Client.DeleteUnusedImage(ctx, pool, name, isImage, keep)
}

// TestImageAskedForDuringCollectionKept: an image unused for the grace
// period, which a reconcile asks for (Want, as a machine naming it by
// spec.image.volume does) between the sweep's decision and the delete, is
// kept: the collector asks again with the image's lock held. Before, the
// sweep's decision alone counted and the image was deleted.
func TestImageAskedForDuringCollectionKept(t *testing.T) {
	const grace = time.Hour
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	pool := testlibvirt.Pool(t, uri, c)
	var im *Importer
	asked := 0
	im = New(&askingStore{Client: c, ask: func(p, name string) {
		asked++
		im.Want(nil, p, name)
	}}, Options{GCAfter: grace})
	clk := &clock{now: time.Now()}
	im.now = clk.Now
	im.gcPools = func(p string) bool { return p == pool }
	t.Cleanup(func() {
		im.cancel()
		im.wg.Wait()
	})
	ctx := context.Background()
	img := importQCOW2(t, c, pool, 1<<20)
	unusedSince := map[imageRef]time.Time{}
	im.sweep(ctx, unusedSince)
	clk.Add(grace + time.Second)
	im.sweep(ctx, unusedSince)
	if asked != 1 {
		t.Fatalf("the collector tried to delete %d times, want once", asked)
	}
	if _, err := c.VolumeInfo(ctx, pool, img); err != nil {
		t.Errorf("the image asked for during its collection: %v", err)
	}
}
