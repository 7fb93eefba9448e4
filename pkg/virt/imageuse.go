package virt

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"libvirt.org/go/libvirt"
)

// VolumeRef names a volume.
type VolumeRef struct {
	Pool, Name string
}

// ImageUse is a base image volume and what uses it.
type ImageUse struct {
	// Volume is the image; AllocationBytes is what it takes on the host.
	Volume VolumeInfo
	// Users are the volumes of any active pool of the host whose backing
	// file it is: the overlays (root disks) made on it.
	Users []VolumeRef
	// Partial is true while its import marker exists: an import writes it
	// or was interrupted.
	Partial bool
}

// ImageUses lists the volumes of every active pool whose name isImage
// accepts (the provider's imported images: naming.IsImageVolumeName) with
// their sizes and the volumes backed by each. Quota code counts their
// allocation; the image collector removes those nobody uses. Volumes that
// vanish while being listed are skipped.
func (c *Client) ImageUses(ctx context.Context, isImage func(name string) bool) ([]ImageUse, error) {
	var out []ImageUse
	err := c.withConn(ctx, "ImageUses", func(conn *libvirt.Connect) error {
		vols, err := allVolumes(conn)
		if err != nil {
			return err
		}
		out = imageUses(vols, isImage)
		return nil
	})
	return out, err
}

// imageUses picks the images out of vols and finds their users by path.
func imageUses(vols []VolumeInfo, isImage func(string) bool) []ImageUse {
	users := map[string][]VolumeRef{}
	names := map[VolumeRef]bool{}
	for _, v := range vols {
		names[VolumeRef{v.Pool, v.Name}] = true
		if v.BackingPath != "" {
			users[v.BackingPath] = append(users[v.BackingPath], VolumeRef{v.Pool, v.Name})
		}
	}
	var out []ImageUse
	for _, v := range vols {
		if !isImage(v.Name) {
			continue
		}
		out = append(out, ImageUse{Volume: v, Users: users[v.Path], Partial: names[VolumeRef{v.Pool, v.Name + partialSuffix}]})
	}
	return out
}

// allVolumes describes every volume of every active pool.
func allVolumes(conn *libvirt.Connect) ([]VolumeInfo, error) {
	pools, err := conn.ListAllStoragePools(libvirt.CONNECT_LIST_STORAGE_POOLS_ACTIVE)
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	var out []VolumeInfo
	var firstErr error
	for i := range pools {
		if firstErr == nil {
			vols, err := poolVolumes(&pools[i])
			if err != nil && !IsNotFound(err) {
				firstErr = err
			}
			out = append(out, vols...)
		}
		_ = pools[i].Free()
	}
	return out, firstErr
}

// poolVolumes describes the volumes of one pool.
func poolVolumes(p *libvirt.StoragePool) ([]VolumeInfo, error) {
	name, err := p.GetName()
	if err != nil {
		return nil, err
	}
	vols, err := p.ListAllStorageVolumes(0)
	if err != nil {
		return nil, fmt.Errorf("listing volumes of %s: %w", name, err)
	}
	var out []VolumeInfo
	var firstErr error
	for i := range vols {
		if firstErr == nil {
			info, err := describeVolume(name, &vols[i])
			switch {
			case IsNotFound(err): // vanished while listing
			case err != nil:
				firstErr = err
			default:
				out = append(out, info)
			}
		}
		_ = vols[i].Free()
	}
	return out, firstErr
}

// ErrImageInUse is DeleteUnusedImage's refusal of an image a volume is
// backed by, an overlay is being made on, an import writes or the caller
// keeps.
var ErrImageInUse = errors.New("image in use")

// DeleteUnusedImage deletes the image volume pool/name unless, checked
// again with the import claim, the pool lock and the image's lock held, a
// volume of the host is backed by it, an overlay is being made on it, an
// import writes it or keep (when set, asked last) says to keep it: then
// ErrImageInUse. isImage is ImageUses' filter; a volume it does not accept
// is never deleted. A missing volume is success. It never waits for the
// creation of an overlay: the image is in use.
func (c *Client) DeleteUnusedImage(ctx context.Context, pool, name string, isImage func(string) bool, keep func() bool) error {
	if !isImage(name) {
		return fmt.Errorf("volume %s/%s is not an imported image", pool, name)
	}
	release, ok := c.tryLockPool(importClaimKey + pool + "/" + name)
	if !ok {
		return fmt.Errorf("%w: %s/%s is being imported", ErrImageInUse, pool, name)
	}
	defer release()
	unlock, err := c.lockPool(ctx, pool)
	if err != nil {
		return err
	}
	defer unlock()
	// Taken last, so that an overlay's creation never waits for the pool.
	ref := VolumeRef{Pool: pool, Name: name}
	unlockImage, ok := c.images.tryLock(ref)
	if !ok {
		return fmt.Errorf("%w: an overlay is being made on %s/%s", ErrImageInUse, pool, name)
	}
	defer unlockImage()
	return c.withConn(ctx, "DeleteUnusedImage", func(conn *libvirt.Connect) error {
		vols, err := allVolumes(conn)
		if err != nil {
			return err
		}
		for _, u := range imageUses(vols, func(n string) bool { return n == name }) {
			if u.Volume.Pool != pool {
				continue
			}
			if len(u.Users) > 0 || u.Partial {
				return fmt.Errorf("%w: %s/%s backs %v (partial: %t)", ErrImageInUse, pool, name, u.Users, u.Partial)
			}
			if keep != nil && keep() {
				return fmt.Errorf("%w: %s/%s was asked for since it was found unused", ErrImageInUse, pool, name)
			}
			c.images.beforeDelete(ref)
			return ignoreNotFound(withPool(conn, pool, func(p *libvirt.StoragePool) error { return deleteVolume(p, name) }))
		}
		return nil
	})
}

// imageLocks keep the creation of overlays and the collection of images
// apart, per image of one Client. EnsureOverlay holds its base's lock
// shared from reading the base to creating the overlay; DeleteUnusedImage
// holds it alone from re-listing the image's users to deleting it. An
// overlay is then either among the users that re-listing sees, or made
// after the delete, when EnsureOverlay finds no base (ErrImageNotFound)
// and the import runs again: no overlay is left backed by nothing.
//
// The locks are this process's: they hold for everything one manager does
// on a host, local or remote (one Client per URI). libvirt offers no lock
// that a second process could share, and two managers on one host are not
// expected (one leader reconciles and collects); an overlay another
// process's collection broke is reported by VolumeInfo.BackingMissing and
// ErrBaseImageMissing, never reused silently.
type imageLocks struct {
	mu    sync.Mutex
	locks map[VolumeRef]*sync.RWMutex
	// hooks are test seams: waiting runs when a creation finds its base
	// locked and is about to wait; deleting runs when a collection found
	// an image unused and is about to delete it. Set before use only.
	waiting, deleting func(VolumeRef)
}

// lock returns image's lock.
func (l *imageLocks) lock(image VolumeRef) *sync.RWMutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.locks[image]
	if !ok {
		if l.locks == nil {
			l.locks = map[VolumeRef]*sync.RWMutex{}
		}
		m = &sync.RWMutex{}
		l.locks[image] = m
	}
	return m
}

// share takes image's lock shared, for making an overlay on it. It waits
// only for a collection's re-listing and delete, a few libvirt calls: the
// collection takes the image's lock after the pool's, and never waits for
// it.
func (l *imageLocks) share(image VolumeRef) func() {
	m := l.lock(image)
	if !m.TryRLock() {
		if l.waiting != nil {
			l.waiting(image)
		}
		m.RLock()
	}
	return m.RUnlock
}

// tryLock takes image's lock alone when nobody holds it, for collection.
func (l *imageLocks) tryLock(image VolumeRef) (func(), bool) {
	m := l.lock(image)
	if !m.TryLock() {
		return nil, false
	}
	return m.Unlock, true
}

// beforeDelete runs the test seam of a collection about to delete image.
func (l *imageLocks) beforeDelete(image VolumeRef) {
	if l.deleting != nil {
		l.deleting(image)
	}
}
