// Package disk gives a VM its root disk: a qcow2 overlay on a base
// image that is imported into the pool once or named as an existing volume.
package disk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Rechecks of problems the user fixes outside the provider; no watch
// covers a pool or an image file.
const (
	recheckMissing  = time.Minute
	recheckChecksum = 5 * time.Minute
)

// recheckImport is how often DiskReady's progress of a running import is
// refreshed; the import's end triggers a reconcile at once.
const recheckImport = 10 * time.Second

// Importer runs image imports outside the reconcile (imageimport.Importer).
type Importer interface {
	// Ensure registers the waiter and returns the import's status.
	Ensure(key imageimport.Key, w imageimport.Waiter) imageimport.Status
	// Release ends the waiter's wait; an import nobody waits for stops.
	Release(w imageimport.Waiter)
	// Want records that a base image named by spec.image.volume is used:
	// the image collector spares it.
	Want(host virt.StorageHost, pool, volume string)
}

// Service makes the root disk; its outcome is DiskReady's.
type Service struct {
	vm     *scope.VM
	host   virt.StorageHost
	images Importer
	// maxBytes bounds the root disk whatever the image (0: no bound).
	maxBytes uint64
	// volume is what the last Reconcile ensured.
	volume *virt.VolumeInfo
}

var _ services.Service = (*Service)(nil)

// New returns the disk service of vm; images imports base images given by URL.
func New(vm *scope.VM, host virt.StorageHost, images Importer) *Service {
	return &Service{vm: vm, host: host, images: images}
}

// WithMaxBytes bounds the root disk at n bytes (the operator's
// --max-machine-disk), whatever size the base image gives it.
func (svc *Service) WithMaxBytes(n uint64) *Service {
	svc.maxBytes = n
	return svc
}

func (*Service) Name() string { return "disk" }

// Volume is the root disk's volume as the last Reconcile ensured it, which
// the domain step defines the domain on; nil when it did not run or
// stopped.
func (svc *Service) Volume() *virt.VolumeInfo { return svc.volume }

// Reconcile ensures the overlay exists with at least the requested size.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.volume = nil
	pool := vm.Pool
	want := vm.DiskSizeBytes
	if info, err := svc.host.VolumeInfo(ctx, pool.Name, vm.OverlayVolume()); err == nil {
		if info.BackingMissing {
			return services.Result{}, fail(virt.ErrBaseImageMissing,
				"Root disk %s/%s is backed by %s, which is gone (deleted, or its pool stopped): the disk cannot be read and is not reused; restart the pool, or delete the machine to have a new one made",
				pool.Name, info.Name, info.BackingPath)
		}
		if info.CapacityBytes >= want {
			svc.volume = &info
			return services.Done(infrav1.ReadyReason, ""), nil
		}
	}
	if pool.Path != "" {
		if err := svc.host.EnsurePool(ctx, pool); err != nil {
			return services.Result{}, fail(err, "Ensuring storage pool %s: %v", pool.Name, err)
		}
	}
	basePool, baseVolume, err := svc.baseImage(ctx, pool.Name)
	if err != nil {
		return services.Result{}, err
	}
	info, err := svc.host.EnsureOverlay(ctx, virt.OverlaySpec{
		Pool: pool.Name, Name: vm.OverlayVolume(),
		BackingPool: basePool, BackingVolume: baseVolume,
		CapacityBytes: want, MaxCapacityBytes: svc.maxBytes,
	})
	if err != nil {
		return services.Result{}, fail(err, "Creating the root disk on %s/%s: %v", basePool, baseVolume, err)
	}
	svc.volume = &info
	return services.Done(infrav1.ReadyReason, ""), nil
}

// baseImage returns the base volume: imported from spec.image.url (named
// after its checksum, so it is shared and never stale), or the named one.
func (svc *Service) baseImage(ctx context.Context, pool string) (string, string, error) {
	img := svc.vm.Image
	if img.Volume != nil {
		p := img.Volume.Pool
		if p == "" {
			p = pool
		}
		if svc.images != nil && naming.IsImageVolumeName(img.Volume.Name) {
			svc.images.Want(svc.host, p, img.Volume.Name)
		}
		return p, img.Volume.Name, nil
	}
	sum, ok := strings.CutPrefix(img.Checksum, "sha256:")
	if img.URL == "" || !ok {
		return "", "", services.Fail(infrav1.ImageNotFoundReason, services.Requeue(0, "no image"),
			"spec.image needs a volume, or a url with a sha256 checksum")
	}
	return svc.importImage(imageimport.Key{Host: svc.host, Pool: pool, Volume: naming.ImageVolumeName(sum), Source: img.URL, SHA256: sum,
		DiskBytes: svc.vm.DiskSizeBytes})
}

// importImage asks the importer for the image and reports how its import
// goes; the reconcile never waits for it.
func (svc *Service) importImage(key imageimport.Key) (string, string, error) {
	if svc.images == nil {
		return "", "", services.Fail(infrav1.ImageImportFailedReason, errors.New("disk service without an image importer"),
			"No image importer is configured to fetch %s", virt.RedactURL(key.Source))
	}
	st := svc.images.Ensure(key, svc.waiter())
	switch st.Phase {
	case imageimport.Done:
		svc.images.Release(svc.waiter())
		return key.Pool, st.Volume.Name, nil
	case imageimport.Refused:
		return "", "", services.Fail(importFailureReason(st.Err), services.Requeue(recheckChecksum, "image refused"),
			"Importing %s was refused; it is not fetched again until spec.image or the disk size changes: %v", virt.RedactURL(key.Source), st.Err)
	case imageimport.Failed:
		retry := max(time.Until(st.RetryAt), time.Second)
		return "", "", services.Fail(importFailureReason(st.Err), services.Requeue(retry, "image import failed"),
			"Importing %s failed (attempt %d, next in %s): %v", virt.RedactURL(key.Source), st.Attempt, retry.Round(time.Second), st.Err)
	default:
		return "", "", services.Fail(infrav1.WaitingForImageImportReason, services.Requeue(recheckImport, "image import running"),
			"Importing %s (attempt %d): %s", virt.RedactURL(key.Source), st.Attempt, st.Progress())
	}
}

// waiter is the VM's owner, whose reconcile the importer triggers.
func (svc *Service) waiter() imageimport.Waiter {
	o := svc.vm.Owner
	return imageimport.Waiter{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}
}

// importFailureReason is DiskReady's reason for a failed import.
func importFailureReason(err error) string {
	if r := imageimport.RefusalReason(err); r != "" {
		return r
	}
	switch {
	case errors.Is(err, virt.ErrImageNotFound):
		return infrav1.ImageNotFoundReason
	case errors.Is(err, virt.ErrChecksumMismatch):
		return infrav1.ImageChecksumMismatchReason
	case errors.Is(err, virt.ErrPoolFull):
		return infrav1.PoolFullReason
	default:
		return infrav1.ImageImportFailedReason
	}
}

// fail reports err with the reason it calls for: problems a user must fix
// are rechecked periodically, others are retried with the controller's
// backoff.
func fail(err error, format string, args ...any) error {
	if r := imageimport.RefusalReason(err); r != "" {
		return services.Fail(r, services.Requeue(recheckChecksum, "image refused"), format, args...)
	}
	switch {
	case errors.Is(err, virt.ErrBaseImageMissing):
		return services.Fail(infrav1.BaseImageMissingReason, services.Requeue(recheckMissing, "base image gone"), format, args...)
	case errors.Is(err, virt.ErrImageNotFound):
		return services.Fail(infrav1.ImageNotFoundReason, services.Requeue(recheckMissing, "image not found"), format, args...)
	case errors.Is(err, virt.ErrChecksumMismatch):
		return services.Fail(infrav1.ImageChecksumMismatchReason, services.Requeue(recheckChecksum, "image checksum mismatch"), format, args...)
	case errors.Is(err, virt.ErrPoolFull):
		return services.Fail(infrav1.PoolFullReason, services.Requeue(recheckMissing, "pool full"), format, args...)
	case virt.IsNotFound(err):
		// The pool (named but not created by us) is missing.
		return services.Fail(infrav1.ImageNotFoundReason, services.Requeue(recheckMissing, "pool or volume missing"), format, args...)
	default:
		return services.Fail(infrav1.LibvirtErrorReason, fmt.Errorf("root disk: %w", err), format, args...)
	}
}

// Delete stops waiting for an image import and removes the overlay; the
// shared base image stays.
func (svc *Service) Delete(ctx context.Context) error {
	if svc.images != nil {
		svc.images.Release(svc.waiter())
	}
	if err := svc.host.DeleteVolume(ctx, svc.vm.Pool.Name, svc.vm.OverlayVolume()); err != nil {
		return fmt.Errorf("deleting the root disk: %w", err)
	}
	return nil
}
