// Package fakehost is an in-memory virt.Host for unit tests of the scope
// and the services. Integration tests use the real libvirtd instead.
package fakehost

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Host implements virt.Host in memory. Methods it does not fake panic
// through the nil embedded interface. Errs[method] makes that method fail.
type Host struct {
	virt.Host

	mu sync.Mutex
	// Volumes maps "pool/name" to the volume; Data holds uploaded bytes.
	Volumes map[string]virt.VolumeInfo
	Data    map[string][]byte
	Pools   map[string]virt.PoolSpec
	// Domains maps name to its info; Specs keeps what EnsureDomain got.
	Domains map[string]virt.DomainInfo
	Specs   map[string]virt.DomainSpec
	// Entries are reservations per network; Leases per network (MAC → IP).
	Entries map[string][]virt.Reservation
	Leases  map[string]map[string]netip.Addr
	// NoDHCP networks have no reservations (ErrNoDHCP).
	NoDHCP map[string]bool
	// Files are guest files per domain ("domain:path").
	Files map[string][]byte
	// Images maps a source to its sha256 for ImportImage.
	Images map[string]string
	// MemoryBytes is what HostMemory reports; New sets 16 GiB.
	MemoryBytes uint64
	// Errs makes the named method return the error.
	Errs map[string]error
	// Calls records method names in order.
	Calls []string
	// Watches records WatchLease calls ("network/mac").
	Watches []string
	// OnCall, when set, runs at the start of every call.
	OnCall func(method string)
}

// New returns an empty host with one NAT network "net" (192.168.100.0/24).
func New() *Host {
	return &Host{
		Volumes: map[string]virt.VolumeInfo{}, Data: map[string][]byte{}, Pools: map[string]virt.PoolSpec{},
		Domains: map[string]virt.DomainInfo{}, Specs: map[string]virt.DomainSpec{},
		Entries: map[string][]virt.Reservation{"net": nil}, Leases: map[string]map[string]netip.Addr{},
		NoDHCP: map[string]bool{}, Files: map[string][]byte{}, Images: map[string]string{}, Errs: map[string]error{},
		MemoryBytes: 16 << 30,
	}
}

func (h *Host) call(method string) error {
	h.mu.Lock()
	h.Calls = append(h.Calls, method)
	hook := h.OnCall
	err := h.Errs[method]
	h.mu.Unlock()
	if hook != nil {
		hook(method)
	}
	return err
}

// Called tells whether method was called.
func (h *Host) Called(method string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.Calls {
		if c == method {
			return true
		}
	}
	return false
}

func notFound(what string) error { return fmt.Errorf("%s: %w", what, virt.ErrNotFound) }

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

// EnsureDomain defines a shut-off domain or returns the existing one.
func (h *Host) EnsureDomain(_ context.Context, spec virt.DomainSpec) (virt.DomainInfo, error) {
	if err := h.call("EnsureDomain"); err != nil {
		return virt.DomainInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d, ok := h.Domains[spec.Name]; ok {
		if !strings.EqualFold(d.UUID, spec.UUID) {
			return virt.DomainInfo{}, &virt.DomainReplacedError{Name: spec.Name, ExpectedUUID: spec.UUID, ActualUUID: d.UUID}
		}
		return d, nil
	}
	owner := spec.Owner
	d := virt.DomainInfo{Name: spec.Name, UUID: strings.ToLower(spec.UUID), State: "shutoff", Reason: "unknown",
		VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB, MAC: spec.MAC, Owner: &owner}
	h.Domains[spec.Name] = d
	h.Specs[spec.Name] = spec
	return d, nil
}

// StartDomain marks a domain running.
func (h *Host) StartDomain(_ context.Context, name string) error {
	if err := h.call("StartDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.Domains[name]
	if !ok {
		return notFound("domain " + name)
	}
	d.State, d.Reason = "running", "booted"
	h.Domains[name] = d
	return nil
}

// ShutdownDomain marks a domain shut off.
func (h *Host) ShutdownDomain(_ context.Context, name string, _ time.Duration) error {
	if err := h.call("ShutdownDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d, ok := h.Domains[name]; ok {
		d.State, d.Reason = "shutoff", "shutdown"
		h.Domains[name] = d
	}
	return nil
}

// DeleteDomain removes a domain; missing is success.
func (h *Host) DeleteDomain(_ context.Context, name string) error {
	if err := h.call("DeleteDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.Domains, name)
	return nil
}

// DomainInfo describes a domain.
func (h *Host) DomainInfo(_ context.Context, name string) (virt.DomainInfo, error) {
	if err := h.call("DomainInfo"); err != nil {
		return virt.DomainInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.Domains[name]
	if !ok {
		return d, notFound("domain " + name)
	}
	return d, nil
}

// HostMemory reports MemoryBytes.
func (h *Host) HostMemory(context.Context) (uint64, error) {
	if err := h.call("HostMemory"); err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.MemoryBytes, nil
}

// GuestReadFile returns Files[domain:path].
func (h *Host) GuestReadFile(_ context.Context, domain, path string) ([]byte, error) {
	if err := h.call("GuestReadFile"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	data, ok := h.Files[domain+":"+path]
	if !ok {
		return nil, notFound("guest file " + path)
	}
	return data, nil
}

// GuestWriteFile is not used by the machine services.
func (h *Host) GuestWriteFile(context.Context, string, string, []byte, os.FileMode) error {
	return h.call("GuestWriteFile")
}

// ReserveAddress reserves the next free address of 192.168.100.0/24.
func (h *Host) ReserveAddress(_ context.Context, network string, r virt.Reservation) (netip.Addr, error) {
	if err := h.call("ReserveAddress"); err != nil {
		return netip.Addr{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.NoDHCP[network] {
		return netip.Addr{}, virt.ErrNoDHCP
	}
	entries, ok := h.Entries[network]
	if !ok {
		return netip.Addr{}, notFound("network " + network)
	}
	used := []netip.Addr{}
	for _, e := range entries {
		if netalloc.SameMAC(e.MAC, r.MAC) {
			return e.IP, nil
		}
		used = append(used, e.IP)
	}
	ip, err := netalloc.NextFreeAddress(netip.MustParsePrefix("192.168.100.0/24"), used)
	if err != nil {
		return netip.Addr{}, err
	}
	h.Entries[network] = append(entries, virt.Reservation{MAC: strings.ToLower(r.MAC), IP: ip})
	return ip, nil
}

// ReleaseAddress removes mac's entry.
func (h *Host) ReleaseAddress(_ context.Context, network, mac string) error {
	if err := h.call("ReleaseAddress"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var keep []virt.Reservation
	for _, e := range h.Entries[network] {
		if !netalloc.SameMAC(e.MAC, mac) {
			keep = append(keep, e)
		}
	}
	if _, ok := h.Entries[network]; ok {
		h.Entries[network] = keep
	}
	return nil
}

// Reservations lists a network's entries.
func (h *Host) Reservations(_ context.Context, network string) ([]virt.Reservation, error) {
	if err := h.call("Reservations"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.NoDHCP[network] {
		return nil, virt.ErrNoDHCP
	}
	entries, ok := h.Entries[network]
	if !ok {
		return nil, notFound("network " + network)
	}
	return append([]virt.Reservation(nil), entries...), nil
}

// Addresses reports leases first, then the reservation.
func (h *Host) Addresses(_ context.Context, q virt.AddressQuery) ([]virt.Address, error) {
	if err := h.call("Addresses"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []virt.Address
	for mac, ip := range h.Leases[q.Network] {
		if netalloc.SameMAC(mac, q.MAC) {
			out = append(out, virt.Address{IP: ip, Source: virt.AddressSourceLease})
		}
	}
	for _, e := range h.Entries[q.Network] {
		if netalloc.SameMAC(e.MAC, q.MAC) && (len(out) == 0 || out[0].IP != e.IP) {
			out = append(out, virt.Address{IP: e.IP, Source: virt.AddressSourceReservation})
		}
	}
	return out, nil
}

// WatchLease records the call.
func (h *Host) WatchLease(_ context.Context, network, mac string) error {
	if err := h.call("WatchLease"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Watches = append(h.Watches, network+"/"+strings.ToLower(mac))
	return nil
}

// Subscribe returns a channel closed when ctx ends.
func (h *Host) Subscribe(ctx context.Context) <-chan virt.Event {
	ch := make(chan virt.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}
