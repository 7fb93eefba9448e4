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
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Rechecks of problems the user fixes outside the provider; no watch
// covers a pool or an image file.
const (
	recheckMissing  = time.Minute
	recheckChecksum = 5 * time.Minute
)

// Service owns the DiskReady condition.
type Service struct{ scope scope.VM }

var _ services.Service = (*Service)(nil)

// New returns the disk service of s.
func New(s scope.VM) *Service { return &Service{scope: s} }

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
	info, err := svc.scope.LibvirtHost().ImportImage(ctx, virt.ImageImport{
		Pool: pool, Volume: scope.ImageVolumeName(sum), Source: img.URL, SHA256: sum,
	})
	if err != nil {
		return "", "", svc.fail(err, "Importing %s: %v", img.URL, err)
	}
	return pool, info.Name, nil
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

// Delete removes the overlay; the shared base image stays.
func (svc *Service) Delete(ctx context.Context) error {
	s := svc.scope
	if err := s.LibvirtHost().DeleteVolume(ctx, s.Pool().Name, s.OverlayVolume()); err != nil && !virt.IsNotFound(err) {
		return fmt.Errorf("deleting the root disk: %w", err)
	}
	return nil
}
