package imageimport

import (
	"errors"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// RefusalReason is the condition reason for an image refused for what it
// is or where it comes from; "" for other errors.
func RefusalReason(err error) string {
	switch {
	case errors.Is(err, virt.ErrImageHasBackingFile):
		return infrav1.ImageHasBackingFileReason
	case errors.Is(err, virt.ErrImageHasDataFile):
		return infrav1.ImageHasDataFileReason
	case errors.Is(err, virt.ErrImageFormatUnsupported):
		return infrav1.ImageFormatUnsupportedReason
	case errors.Is(err, virt.ErrImageTooLarge):
		return infrav1.ImageTooLargeReason
	case errors.Is(err, virt.ErrImageLargerThanDisk):
		return infrav1.ImageLargerThanDiskReason
	case errors.Is(err, virt.ErrDiskTooLarge):
		return infrav1.MachineSizeNotAllowedReason
	case errors.Is(err, virt.ErrImageSourceRefused):
		return infrav1.ImageSourceNotAllowedReason
	}
	return ""
}

// progress records how far an attempt read, counting what it read since
// the last call in capl_image_import_bytes_total.
func (a *attempt) progress(read, total int64) {
	if prev := a.read.Swap(read); read > prev {
		metrics.ImageImportBytes.Add(float64(read - prev))
	}
	a.total.Store(total)
}

// observeAttempt records an attempt's duration by result, and its refusal
// by reason.
func observeAttempt(result string, took time.Duration, err error) {
	metrics.ImageImportDuration.WithLabelValues(result).Observe(took.Seconds())
	if r := RefusalReason(err); r != "" {
		metrics.ImageImportRefusals.WithLabelValues(r).Inc()
	}
}
