package virt_test

import (
	"errors"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestOverlayMadeWhileImageCollected: the collection of an image found
// unused is paused between its re-listing of the image's users and its
// delete, and a reconcile makes an overlay on the image then. Either the
// overlay waits for the collection and, the image gone, is not made
// (ErrImageNotFound: the import runs again), or, were it made, its base
// would still exist. Before, EnsureOverlay took no lock the collection
// respects: the overlay was made at once, and the delete that followed
// left it backed by nothing.
func TestOverlayMadeWhileImageCollected(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	img := e.importBase(t, e.volName(t, "image"), 64*mib)
	isImage := func(n string) bool { return n == img.Name }
	spec := virt.OverlaySpec{Pool: e.pool, Name: e.volName(t, "overlay"), BackingPool: e.pool, BackingVolume: img.Name}
	t.Cleanup(func() { _ = e.c.DeleteVolume(testCtx(t), e.pool, spec.Name) })

	made := make(chan error, 1)
	waiting := make(chan struct{}, 1)
	paused := false
	virt.SetImageLockHooks(e.c, func(virt.VolumeRef) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}, func(ref virt.VolumeRef) {
		paused = true
		go func() {
			_, err := e.c.EnsureOverlay(ctx, spec)
			made <- err
		}()
		// The collection goes on once the overlay exists, or once its
		// creation waits for the collection.
		select {
		case err := <-made:
			made <- err
			t.Logf("the overlay was made while %s/%s was being collected (err %v)", ref.Pool, ref.Name, err)
		case <-waiting:
			t.Logf("the overlay waits for the collection of %s/%s", ref.Pool, ref.Name)
		case <-ctx.Done():
			t.Error("the overlay neither was made nor waits")
		}
	})
	defer virt.SetImageLockHooks(e.c, nil, nil)

	collectErr := e.c.DeleteUnusedImage(ctx, e.pool, img.Name, isImage, nil)
	if !paused {
		t.Fatalf("the collection never reached its delete: %v", collectErr)
	}
	overlayErr := <-made
	t.Logf("collection: %v; overlay: %v", collectErr, overlayErr)
	overlay, err := e.c.VolumeInfo(ctx, e.pool, spec.Name)
	switch {
	case virt.IsNotFound(err):
		if !errors.Is(overlayErr, virt.ErrImageNotFound) {
			t.Errorf("no overlay, and its creation said %v, want ErrImageNotFound", overlayErr)
		}
	case err != nil:
		t.Fatal(err)
	default:
		base, err := e.c.VolumeInfo(ctx, e.pool, img.Name)
		if err != nil || base.Path != overlay.BackingPath {
			t.Errorf("the overlay made during collection is backed by %s, and its base %s/%s is gone (%v)", overlay.BackingPath, e.pool, img.Name, err)
		}
	}
}

// TestOverlayWithBaseGone: an overlay whose base volume was deleted (by
// hand, or by a collection this process does not know of) is reported by
// VolumeInfo.BackingMissing and not reused: EnsureOverlay fails while the
// base is missing, and once an identical base is back under its name the
// overlay is whole again. Before, VolumeInfo said nothing of it and the
// disk service reused it for ever.
func TestOverlayWithBaseGone(t *testing.T) {
	e := newStorageEnv(t)
	ctx := testCtx(t)
	name := e.volName(t, "image")
	img := e.importBase(t, name, 64*mib)
	spec := virt.OverlaySpec{Pool: e.pool, Name: e.volName(t, "overlay"), BackingPool: e.pool, BackingVolume: img.Name}
	t.Cleanup(func() { _ = e.c.DeleteVolume(testCtx(t), e.pool, spec.Name) })
	if _, err := e.c.EnsureOverlay(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if info, err := e.c.VolumeInfo(ctx, e.pool, spec.Name); err != nil || info.BackingMissing {
		t.Fatalf("overlay on an existing base: %+v, %v", info, err)
	}
	if err := e.c.DeleteVolume(ctx, e.pool, img.Name); err != nil {
		t.Fatal(err)
	}
	info, err := e.c.VolumeInfo(ctx, e.pool, spec.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !info.BackingMissing || info.BackingPath != img.Path {
		t.Errorf("overlay with its base gone: BackingMissing %t, backing %q (base was %s)", info.BackingMissing, info.BackingPath, img.Path)
	}
	if _, err := e.c.EnsureOverlay(ctx, spec); !errors.Is(err, virt.ErrImageNotFound) {
		t.Errorf("EnsureOverlay with the base gone: %v, want ErrImageNotFound", err)
	}
	// Another base named as the disk's: the overlay is not silently
	// taken for a disk on it.
	other := e.importBase(t, e.volName(t, "other"), 64*mib)
	spec.BackingVolume = other.Name
	if _, err := e.c.EnsureOverlay(ctx, spec); !errors.Is(err, virt.ErrBaseImageMissing) {
		t.Errorf("EnsureOverlay of an overlay whose base is gone, on another base: %v, want ErrBaseImageMissing", err)
	}
	e.importBase(t, name, 64*mib)
	if info, err := e.c.VolumeInfo(ctx, e.pool, spec.Name); err != nil || info.BackingMissing {
		t.Errorf("overlay with its base imported again: %+v, %v", info, err)
	}
	for _, v := range []string{name, other.Name} {
		if err := e.c.DeleteVolume(ctx, e.pool, v); err != nil {
			t.Error(err)
		}
	}
}
