package webhooks

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// VolumeInspector reads a storage volume's description; virt.Host
// satisfies it.
type VolumeInspector interface {
	VolumeInfo(ctx context.Context, pool, name string) (virt.VolumeInfo, error)
}

// volumeLookupTimeout bounds the libvirt call an admission request may
// make: the API server gives the whole webhook 10 s, and an unanswered
// lookup only skips a comparison.
const volumeLookupTimeout = 3 * time.Second

// partialVolumeSuffix marks a volume whose import is under way (pkg/virt);
// a base image named like it would be taken for an interrupted import.
const partialVolumeSuffix = ".partial"

// validateImageSource checks what the CRD's pattern cannot: that a URL
// parses and points somewhere the manager can read without credentials in
// the spec, and that a volume name is not one libvirt or the provider
// reserves.
func validateImageSource(img *infrav1.ImageSource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if img.URL != "" {
		errs = append(errs, validateImageURL(img.URL, path.Child("url"))...)
	}
	if v := img.Volume; v != nil {
		switch {
		case v.Name == "." || v.Name == "..":
			errs = append(errs, field.Invalid(path.Child("volume", "name"), v.Name, "must name a volume, not a directory"))
		case strings.HasSuffix(v.Name, partialVolumeSuffix):
			errs = append(errs, field.Invalid(path.Child("volume", "name"), v.Name,
				fmt.Sprintf("must not end in %q, which marks an image import under way", partialVolumeSuffix)))
		}
	}
	return errs
}

func validateImageURL(raw string, path *field.Path) field.ErrorList {
	u, err := url.Parse(raw)
	if err != nil {
		return field.ErrorList{field.Invalid(path, raw, fmt.Sprintf("is not a URL: %v", err))}
	}
	switch {
	case u.User != nil:
		return field.ErrorList{field.Invalid(path, raw, "must not carry credentials: objects are readable by everyone who can list them")}
	case u.Scheme == "file" && u.Host != "" && u.Host != "localhost":
		return field.ErrorList{field.Invalid(path, raw, "a file URL names a path on the manager's host: use file:///absolute/path")}
	case u.Scheme == "file" && !strings.HasPrefix(u.Path, "/"):
		return field.ErrorList{field.Invalid(path, raw, "a file URL needs an absolute path")}
	case u.Scheme != "file" && u.Hostname() == "":
		return field.ErrorList{field.Invalid(path, raw, "needs a host")}
	}
	return nil
}

// imageChecker compares a disk size with the virtual size of its base
// image when that size can be known: the image is a volume (or an imported
// URL) in a pool the webhook can name, and libvirt answers in time.
type imageChecker struct {
	volumes VolumeInspector
	reader  client.Reader
}

// diskWarnings returns a warning when diskSizeGiB is smaller than the base
// image, which the controller refuses: a warning, not an error, because
// the image may still change before the machine's disk is made. pool is
// the pool of images given without one ("" when unknown, as for a template
// shared by clusters). Unknown sizes give no warning.
func (c imageChecker) diskWarnings(ctx context.Context, spec *infrav1.LibvirtMachineSpec, pool string, path *field.Path) []string {
	if c.volumes == nil || spec.DiskSizeGiB == 0 {
		return nil
	}
	img := spec.Image
	name := ""
	switch {
	case img.Volume != nil:
		name = img.Volume.Name
		if img.Volume.Pool != "" {
			pool = img.Volume.Pool
		}
	case img.URL != "":
		sum, ok := strings.CutPrefix(img.Checksum, "sha256:")
		if !ok {
			return nil
		}
		name = naming.ImageVolumeName(sum)
	}
	if pool == "" || name == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, volumeLookupTimeout)
	defer cancel()
	info, err := c.volumes.VolumeInfo(ctx, pool, name)
	if err != nil {
		return nil
	}
	disk := uint64(spec.DiskSizeGiB) << 30
	if info.CapacityBytes <= disk {
		return nil
	}
	return []string{fmt.Sprintf("%s: %d GiB is smaller than the %.1f GiB virtual size of base image %s/%s; the machine will not get a disk (DiskReady ImageLargerThanDisk): raise diskSizeGiB",
		path.Child("diskSizeGiB"), spec.DiskSizeGiB, float64(info.CapacityBytes)/(1<<30), pool, name)}
}

// machinePool is the storage pool of m's volumes: the one recorded on it
// (objects restored or moved by clusterctl), else its LibvirtCluster's, or
// "" when neither can be found (no cluster label yet, no reader, the
// Cluster's infrastructure is not a LibvirtCluster).
func (c imageChecker) machinePool(ctx context.Context, m *infrav1.LibvirtMachine) string {
	if recorded := m.Annotations[scope.PoolAnnotation]; recorded != "" {
		return recorded
	}
	clusterName := m.Labels[clusterv1.ClusterNameLabel]
	if c.reader == nil || clusterName == "" {
		return ""
	}
	cluster := &clusterv1.Cluster{}
	if err := c.reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: clusterName}, cluster); err != nil {
		return ""
	}
	ref := cluster.Spec.InfrastructureRef
	if ref.APIGroup != infrav1.GroupVersion.Group || ref.Kind != "LibvirtCluster" {
		return ""
	}
	lc := &infrav1.LibvirtCluster{}
	if err := c.reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, lc); err != nil {
		return ""
	}
	if lc.Spec.StoragePool.Name != "" {
		return lc.Spec.StoragePool.Name
	}
	return infrav1.DefaultStoragePoolName
}
