package virt

// PoolSpec describes a directory storage pool.
type PoolSpec struct {
	// Name of the libvirt pool.
	Name string
	// Path is the directory on the libvirt host (not the controller's).
	Path string
}

// ImageImport describes a base image to bring into a pool.
type ImageImport struct {
	// Pool receives the volume; it must exist (EnsurePool).
	Pool string
	// Volume is the final volume name; the caller gives it NamePrefix.
	Volume string
	// Source is a path readable by the controller process or an http(s)
	// URL. It is streamed through libvirt, so the libvirt host may be remote.
	Source string
	// SHA256 is the expected hex digest of Source's bytes.
	SHA256 string
}

// OverlaySpec describes a copy-on-write disk on a base volume.
type OverlaySpec struct {
	// Pool and Name place the overlay volume.
	Pool string
	Name string
	// BackingPool and BackingVolume name the base image volume.
	BackingPool   string
	BackingVolume string
	// CapacityBytes is the requested virtual size; the overlay is never
	// smaller than its base.
	CapacityBytes uint64
}

// VolumeInfo describes a storage volume.
type VolumeInfo struct {
	Pool string
	Name string
	// Path is the volume's path on the libvirt host, used in domain XML.
	Path            string
	CapacityBytes   uint64
	AllocationBytes uint64
	// Format is the volume's format type, e.g. "qcow2" or "raw".
	Format string
}
