package fakehost

import (
	"context"
	"fmt"
	"strings"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The fake of virt.StorageHost: pools and volumes.
var _ virt.StorageHost = (*Host)(nil)

// EnsurePool records the pool.
func (h *Host) EnsurePool(_ context.Context, spec virt.PoolSpec) error {
	if err := h.call("EnsurePool"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Pools[spec.Name] = spec
	return nil
}

// ImportImage creates the volume once when the source is known with that sum.
func (h *Host) ImportImage(_ context.Context, img virt.ImageImport) (virt.VolumeInfo, error) {
	if err := h.call("ImportImage"); err != nil {
		return virt.VolumeInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	sum, ok := h.Images[img.Source]
	if !ok {
		return virt.VolumeInfo{}, fmt.Errorf("%w: %s", virt.ErrImageNotFound, img.Source)
	}
	if sum != img.SHA256 {
		return virt.VolumeInfo{}, &virt.ChecksumError{Source: img.Source, Expected: img.SHA256, Actual: sum}
	}
	key := img.Pool + "/" + img.Volume
	if v, ok := h.Volumes[key]; ok {
		return v, nil
	}
	v := virt.VolumeInfo{Pool: img.Pool, Name: img.Volume, Path: "/pools/" + key, CapacityBytes: 2 << 30, Format: "qcow2"}
	h.Volumes[key] = v
	return v, nil
}

// EnsureOverlay creates the overlay when its base exists.
func (h *Host) EnsureOverlay(_ context.Context, spec virt.OverlaySpec) (virt.VolumeInfo, error) {
	if err := h.call("EnsureOverlay"); err != nil {
		return virt.VolumeInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	base, ok := h.Volumes[spec.BackingPool+"/"+spec.BackingVolume]
	if !ok {
		return virt.VolumeInfo{}, fmt.Errorf("%w: base %s/%s", virt.ErrImageNotFound, spec.BackingPool, spec.BackingVolume)
	}
	key := spec.Pool + "/" + spec.Name
	v := h.Volumes[key]
	v.Pool, v.Name, v.Path, v.Format = spec.Pool, spec.Name, "/pools/"+key, "qcow2"
	v.CapacityBytes = max(v.CapacityBytes, spec.CapacityBytes, base.CapacityBytes)
	h.Volumes[key] = v
	return v, nil
}

// UploadVolume stores data.
func (h *Host) UploadVolume(_ context.Context, pool, name string, data []byte) (virt.VolumeInfo, error) {
	if err := h.call("UploadVolume"); err != nil {
		return virt.VolumeInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	key := pool + "/" + name
	v := virt.VolumeInfo{Pool: pool, Name: name, Path: "/pools/" + key, CapacityBytes: uint64(len(data)), Format: "raw"}
	h.Volumes[key] = v
	h.Data[key] = append([]byte(nil), data...)
	return v, nil
}

// ReadVolume returns up to limit bytes of the stored data.
func (h *Host) ReadVolume(_ context.Context, pool, name string, limit int64) ([]byte, error) {
	if err := h.call("ReadVolume"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	data, ok := h.Data[pool+"/"+name]
	if !ok {
		return nil, notFound("volume " + pool + "/" + name)
	}
	return append([]byte(nil), data[:min(int64(len(data)), limit)]...), nil
}

// DeleteVolume removes a volume; missing is success.
func (h *Host) DeleteVolume(_ context.Context, pool, name string) error {
	if err := h.call("DeleteVolume"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.Volumes, pool+"/"+name)
	delete(h.Data, pool+"/"+name)
	return nil
}

// EnsureLogVolume records an empty log volume unless one exists.
func (h *Host) EnsureLogVolume(_ context.Context, pool, name string) (virt.VolumeInfo, error) {
	if err := h.call("EnsureLogVolume"); err != nil {
		return virt.VolumeInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	key := pool + "/" + name
	v, ok := h.Volumes[key]
	if !ok {
		v = virt.VolumeInfo{Pool: pool, Name: name, Path: "/pools/" + pool + "/" + name, Format: virt.FormatRaw}
		h.Volumes[key] = v
	}
	return v, nil
}

// EnsureDataVolume creates an empty qcow2 volume unless it exists; the
// pool must exist (a volume or EnsurePool put it there).
func (h *Host) EnsureDataVolume(_ context.Context, pool, name string, capacity uint64) (virt.VolumeInfo, error) {
	if err := h.call("EnsureDataVolume"); err != nil {
		return virt.VolumeInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	key := pool + "/" + name
	if v, ok := h.Volumes[key]; ok {
		return v, nil
	}
	if !h.poolExistsLocked(pool) {
		return virt.VolumeInfo{}, fmt.Errorf("pool %s: %w", pool, virt.ErrNotFound)
	}
	v := virt.VolumeInfo{Pool: pool, Name: name, Path: "/pools/" + key, Format: virt.FormatQCOW2, CapacityBytes: capacity}
	h.Volumes[key] = v
	return v, nil
}

// DeleteLogVolume removes a log volume.
func (h *Host) DeleteLogVolume(_ context.Context, pool, name string) error {
	if err := h.call("DeleteLogVolume"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.Volumes, pool+"/"+name)
	return nil
}

// VolumeInfo describes a volume.
func (h *Host) VolumeInfo(_ context.Context, pool, name string) (virt.VolumeInfo, error) {
	if err := h.call("VolumeInfo"); err != nil {
		return virt.VolumeInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.Volumes[pool+"/"+name]
	if !ok {
		return v, notFound("volume " + name)
	}
	return v, nil
}

// poolExistsLocked tells whether pool was ensured or holds a volume.
func (h *Host) poolExistsLocked(pool string) bool {
	if _, ok := h.Pools[pool]; ok {
		return true
	}
	for key := range h.Volumes {
		if strings.HasPrefix(key, pool+"/") {
			return true
		}
	}
	return false
}
