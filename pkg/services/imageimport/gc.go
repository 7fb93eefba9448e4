package imageimport

import (
	"context"
	"errors"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// ImageStore is what the image collector needs of a host: *virt.Client.
// Hosts without it (test fakes) are not collected.
type ImageStore interface {
	ImageUses(ctx context.Context, isImage func(name string) bool) ([]virt.ImageUse, error)
	DeleteUnusedImage(ctx context.Context, pool, name string, isImage func(string) bool, keep func() bool) error
}

// imageRef names an imported image on a host.
type imageRef struct {
	host         virt.StorageHost
	pool, volume string
}

// Collector is the manager Runnable that removes the imported images no
// volume was backed by, no import wrote and no reconcile asked for during
// Options.GCAfter, checking every GCInterval; with GCAfter zero it does
// nothing. "Unused since" is what this process observed: after a restart
// every image gets a full GCAfter again, so nothing is removed that the
// collector has not watched unused for that long. It runs on the leader
// only, the replica whose reconciles ask for images.
func (im *Importer) Collector() *Collector { return &Collector{im: im} }

// Collector removes unused imported images (Importer.Collector).
type Collector struct{ im *Importer }

// NeedLeaderElection is true: only the leader knows which images its
// reconciles are about to use.
func (*Collector) NeedLeaderElection() bool { return true }

// Start sweeps every GCInterval until ctx ends.
func (c *Collector) Start(ctx context.Context) error {
	im := c.im
	if im.opts.GCAfter <= 0 {
		return nil
	}
	unused := map[imageRef]time.Time{}
	t := time.NewTicker(im.opts.GCInterval)
	defer t.Stop()
	for {
		im.sweep(ctx, unused)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sweep checks every known host once; unused is when each image was last
// seen in use, carried from sweep to sweep.
func (im *Importer) sweep(ctx context.Context, unused map[imageRef]time.Time) {
	im.forget(im.now().Add(-im.opts.GCAfter))
	seen := map[imageRef]bool{}
	for _, host := range im.knownHosts() {
		store, ok := host.(ImageStore)
		if !ok {
			continue
		}
		uses, err := store.ImageUses(ctx, naming.IsImageVolumeName)
		if err != nil {
			ctrl.Log.WithName("imagegc").Info("Listing imported images failed", "err", err.Error())
			continue
		}
		for _, u := range uses {
			ref := imageRef{host: host, pool: u.Volume.Pool, volume: u.Volume.Name}
			if im.gcPools != nil && !im.gcPools(ref.pool) {
				continue
			}
			seen[ref] = true
			im.sweepOne(ctx, store, ref, u, unused)
		}
	}
	for ref := range unused {
		if !seen[ref] {
			delete(unused, ref)
		}
	}
}

// sweepOne records that ref is in use, or removes it once unused for
// GCAfter.
func (im *Importer) sweepOne(ctx context.Context, store ImageStore, ref imageRef, u virt.ImageUse, unused map[imageRef]time.Time) {
	now := im.now()
	since, known := unused[ref]
	if wanted := im.wantedAt(ref); len(u.Users) > 0 || u.Partial || !known || wanted.After(since) {
		unused[ref] = now
		if wanted.After(now) {
			unused[ref] = wanted
		}
		return
	}
	if now.Sub(since) < im.opts.GCAfter {
		return
	}
	log := ctrl.Log.WithName("imagegc").WithValues("pool", ref.pool, "volume", ref.volume)
	// Asked again with the image's lock held: a reconcile that asked for
	// it since this sweep looked keeps it.
	keep := func() bool { return im.wantedAt(ref).After(since) }
	err := store.DeleteUnusedImage(ctx, ref.pool, ref.volume, naming.IsImageVolumeName, keep)
	switch {
	case errors.Is(err, virt.ErrImageInUse):
		unused[ref] = now
	case err != nil:
		log.Info("Removing an unused image failed", "err", err.Error())
	default:
		delete(unused, ref)
		log.Info("Removed an imported image no disk used", "unusedFor", now.Sub(since).Round(time.Second).String(),
			"bytes", u.Volume.AllocationBytes)
	}
}

// forget drops what reconciles asked for before cutoff, which no longer
// spares an image, and the hosts (but the Importer's own) no reconcile
// asked about since and no import uses: a host the manager stopped
// talking to is not listed again.
func (im *Importer) forget(cutoff time.Time) {
	im.mu.Lock()
	defer im.mu.Unlock()
	keep := map[virt.StorageHost]bool{im.host: true}
	for ref, at := range im.wanted {
		if at.Before(cutoff) {
			delete(im.wanted, ref)
		} else {
			keep[ref.host] = true
		}
	}
	for key := range im.jobs {
		keep[im.hostOf(key)] = true
	}
	for h := range im.hosts {
		if !keep[h] {
			delete(im.hosts, h)
		}
	}
}

// knownHosts are the hosts imports were asked for, the Importer's own first.
func (im *Importer) knownHosts() []virt.StorageHost {
	im.mu.Lock()
	defer im.mu.Unlock()
	out := []virt.StorageHost{im.host}
	for h := range im.hosts {
		if h != im.host {
			out = append(out, h)
		}
	}
	return out
}

// wantedAt is when a reconcile last asked for ref; a running import counts
// as asked for now.
func (im *Importer) wantedAt(ref imageRef) time.Time {
	im.mu.Lock()
	defer im.mu.Unlock()
	for key, j := range im.jobs {
		if j.attempt != nil && im.hostOf(key) == ref.host && key.Pool == ref.pool && key.Volume == ref.volume {
			return im.now()
		}
	}
	return im.wanted[ref]
}
