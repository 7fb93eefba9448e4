// Package disk gives a machine its root disk: a qcow2 overlay on a base
// image that is imported into the pool once or named as an existing volume.
package disk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
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
}

// Service owns the DiskReady condition.
type Service struct {
	scope  scope.VM
	images Importer
}

var _ services.Service = (*Service)(nil)

// New returns the disk service of s; images imports base images given by URL.
func New(s scope.VM, images Importer) *Service { return &Service{scope: s, images: images} }

// Reconcile ensures the overlay exists with at least the requested size.
func (svc *Service) Reconcile(ctx context.Context) error {
	s := svc.scope
	pool := s.Pool()
	want := s.DiskSizeBytes()
	if info, err := s.LibvirtHost().VolumeInfo(ctx, pool.Name, s.OverlayVolume()); err == nil && info.CapacityBytes >= want {
		s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
		return nil
	}
	if pool.Path != "" {
		if err := s.LibvirtHost().EnsurePool(ctx, pool); err != nil {
			return svc.fail(err, "Ensuring storage pool %s: %v", pool.Name, err)
		}
	}
	basePool, baseVolume, err := svc.baseImage(ctx, pool.Name)
	if err != nil {
		return err
	}
	_, err = s.LibvirtHost().EnsureOverlay(ctx, virt.OverlaySpec{
		Pool: pool.Name, Name: s.OverlayVolume(),
		BackingPool: basePool, BackingVolume: baseVolume,
		CapacityBytes: want,
	})
	if err != nil {
		return svc.fail(err, "Creating the root disk on %s/%s: %v", basePool, baseVolume, err)
	}
	s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
	return nil
}

// baseImage returns the base volume: imported from spec.image.url (named
// after its checksum, so it is shared and never stale), or the named one.
func (svc *Service) baseImage(ctx context.Context, pool string) (string, string, error) {
	img := svc.scope.Image()
	if img.Volume != nil {
		p := img.Volume.Pool
		if p == "" {
			p = pool
		}
		return p, img.Volume.Name, nil
	}
	sum, ok := strings.CutPrefix(img.Checksum, "sha256:")
	if img.URL == "" || !ok {
		svc.scope.MarkFalse(infrav1.DiskReadyCondition, infrav1.ImageNotFoundReason, "spec.image needs a volume, or a url with a sha256 checksum")
		return "", "", services.Requeue(0, "no image")
	}
	return svc.importImage(imageimport.Key{Pool: pool, Volume: scope.ImageVolumeName(sum), Source: img.URL, SHA256: sum})
}

// importImage asks the importer for the image and reports how its import
// goes; the reconcile never waits for it.
func (svc *Service) importImage(key imageimport.Key) (string, string, error) {
	s := svc.scope
	if svc.images == nil {
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.ImageImportFailedReason, "No image importer is configured to fetch %s", key.Source)
		return "", "", errors.New("disk service without an image importer")
	}
	st := svc.images.Ensure(key, svc.waiter())
	switch st.Phase {
	case imageimport.Done:
		svc.images.Release(svc.waiter())
		return key.Pool, st.Volume.Name, nil
	case imageimport.Failed:
		retry := max(time.Until(st.RetryAt), time.Second)
		s.MarkFalse(infrav1.DiskReadyCondition, importFailureReason(st.Err), "Importing %s failed (attempt %d, next in %s): %v",
			key.Source, st.Attempt, retry.Round(time.Second), st.Err)
		return "", "", services.Requeue(retry, "image import failed")
	default:
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.WaitingForImageImportReason, "Importing %s (attempt %d): %s",
			key.Source, st.Attempt, st.Progress())
		return "", "", services.Requeue(recheckImport, "image import running")
	}
}

// waiter is the VM's owner, whose reconcile the importer triggers.
func (svc *Service) waiter() imageimport.Waiter {
	o := svc.scope.Owner()
	return imageimport.Waiter{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}
}

// importFailureReason is DiskReady's reason for a failed import.
func importFailureReason(err error) string {
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

// fail sets DiskReady False with the reason the error calls for: problems
// a user must fix are rechecked periodically, others are retried with
// the controller's backoff.
func (svc *Service) fail(err error, format string, args ...any) error {
	s := svc.scope
	switch {
	case errors.Is(err, virt.ErrImageNotFound):
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.ImageNotFoundReason, format, args...)
		return services.Requeue(recheckMissing, "image not found")
	case errors.Is(err, virt.ErrChecksumMismatch):
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.ImageChecksumMismatchReason, format, args...)
		return services.Requeue(recheckChecksum, "image checksum mismatch")
	case errors.Is(err, virt.ErrPoolFull):
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, format, args...)
		return services.Requeue(recheckMissing, "pool full")
	case virt.IsNotFound(err):
		// The pool (named but not created by us) is missing.
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.ImageNotFoundReason, format, args...)
		return services.Requeue(recheckMissing, "pool or volume missing")
	default:
		s.MarkFalse(infrav1.DiskReadyCondition, infrav1.LibvirtErrorReason, format, args...)
		return fmt.Errorf("root disk: %w", err)
	}
}

// Delete stops waiting for an image import and removes the overlay; the
// shared base image stays.
func (svc *Service) Delete(ctx context.Context) error {
	s := svc.scope
	if svc.images != nil {
		svc.images.Release(svc.waiter())
	}
	if err := s.LibvirtHost().DeleteVolume(ctx, s.Pool().Name, s.OverlayVolume()); err != nil && !virt.IsNotFound(err) {
		return fmt.Errorf("deleting the root disk: %w", err)
	}
	return nil
}
