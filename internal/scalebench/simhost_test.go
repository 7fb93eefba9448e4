//go:build scale

package scalebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/leases"
)

// Delays are what each libvirt call costs on the simulated host: a fixed
// part and, for the calls whose cost grows with what the host holds (the
// listings), a part per domain and per volume. docs/performance.md says
// where each figure was measured.
type Delays struct {
	Fixed     map[string]time.Duration
	PerDomain map[string]time.Duration
	PerVolume map[string]time.Duration
	// Boot is how long a started guest takes to hold its DHCP lease and
	// to have finished its bootstrap.
	Boot time.Duration
}

// measuredDelays are the medians of `virsh -t` on this project's 2-core
// host against qemu:///system (20 rounds in one session, connection set
// up; hack/libvirt-timings.sh): define 5.0 ms, dominfo 3.7, metadata
// read 0.6, undefine 2.8, vol-create-as qcow2 33.9, vol-info 2.0,
// vol-delete 3.1, net-update ip-dhcp-host add 4.0 / delete 4.0, list
// --all 0.5. A domain start (QEMU's process) is not measured here, where
// booting guests is not allowed: 140 ms, the restart figure of
// docs/quick-start.md.
func measuredDelays(boot time.Duration) Delays {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	return Delays{
		Fixed: map[string]time.Duration{
			"EnsureDomain": ms(5.0), "DomainInfo": ms(3.7), "DeleteDomain": ms(2.8) + ms(3.7), "StartDomain": ms(140),
			"ShutdownDomain": ms(3.7), "EnsureOverlay": ms(33.9), "EnsureDataVolume": ms(33.9), "EnsureLogVolume": ms(33.9),
			"UploadVolume": ms(33.9), "VolumeInfo": ms(2.0), "ReadVolume": ms(2.0), "DeleteVolume": ms(3.1), "DeleteLogVolume": ms(3.1),
			"ReserveAddress": ms(4.0), "ReleaseAddress": ms(4.0), "ReleaseOwnedAddress": ms(4.0), "Reservations": ms(0.6),
			"Addresses": ms(0.6), "SegmentUse": ms(0.5), "ListOwned": ms(0.5), "EnsureNetwork": ms(5.0), "UseNetwork": ms(0.6),
			"DeleteNetwork": ms(5.0), "EnsurePool": ms(2.0), "HostMemory": ms(0.5), "GuestReadFile": ms(3.7),
		},
		// A listing reads each domain's XML (its metadata) and each volume's info.
		PerDomain: map[string]time.Duration{"ListOwned": ms(0.6), "SegmentUse": ms(0.6)},
		PerVolume: map[string]time.Duration{"ListOwned": ms(0.5)},
		Boot:      boot,
	}
}

// simHost is a simulated libvirt host at the virt.Host boundary: domains
// and volumes as fakehost keeps them, NAT networks with DHCP entries,
// leases that appear a boot delay after a domain starts (with a lease
// event, as the real host's lease watcher publishes), the bootstrap
// sentinel at the same time, and every call delayed as libvirtd takes.
// Its lock serialises fakehost's maps; delays are slept outside it, so
// calls overlap as they do on libvirtd's worker threads.
type simHost struct {
	mu     sync.Mutex
	fake   *fakehost.Host
	delays Delays

	networks map[string]*simNetwork
	subnet   int
	subs     []chan virt.Event
	// running are the domains that are started, with the timer of their boot.
	booting map[string]*time.Timer
	// volumes is the directory of uploaded volumes' bytes (the seeds): a
	// libvirt host keeps them on its disk, not in the memory of the
	// manager, whose RSS the benchmark reports and in whose process the
	// simulated host runs (fakehost would hold 44 MB of seeds at 1000
	// machines).
	volumes string

	calls sync.Map // method → *atomic.Int64
}

type simNetwork struct {
	info    virt.NetworkInfo
	entries []virt.Reservation
	leases  map[netalloc.MAC]netip.Addr
}

var _ virt.Host = (*simHost)(nil)

// baseImage is the base image every machine's disk is backed by.
const (
	imagePool   = "capi-libvirt"
	imageVolume = "scale-base.qcow2"
)

func newSimHost(d Delays) (*simHost, error) {
	dir, err := os.MkdirTemp("", "capl-scale-volumes-")
	if err != nil {
		return nil, err
	}
	f := fakehost.New()
	f.MemoryBytes = 1 << 50
	f.Volumes[imagePool+"/"+imageVolume] = virt.VolumeInfo{Pool: imagePool, Name: imageVolume,
		Path: "/var/lib/libvirt/images/" + imageVolume, CapacityBytes: 2 << 30, AllocationBytes: 600 << 20, Format: "qcow2"}
	// fakehost records every call; the simulation counts them instead.
	return &simHost{fake: f, delays: d, networks: map[string]*simNetwork{}, booting: map[string]*time.Timer{}, volumes: dir}, nil
}

// close removes the uploaded volumes' bytes.
func (s *simHost) close() { _ = os.RemoveAll(s.volumes) }

// volumeFile is where the bytes of pool's volume name are kept.
func (s *simHost) volumeFile(pool, name string) string {
	return filepath.Join(s.volumes, url.PathEscape(pool+"/"+name))
}

// begin counts and delays one call of method; the caller then takes the lock.
func (s *simHost) begin(method string) {
	c, _ := s.calls.LoadOrStore(method, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	d := s.delays.Fixed[method]
	if pd, pv := s.delays.PerDomain[method], s.delays.PerVolume[method]; pd != 0 || pv != 0 {
		s.mu.Lock()
		d += time.Duration(len(s.fake.Domains))*pd + time.Duration(len(s.fake.Volumes))*pv
		s.mu.Unlock()
	}
	if d > 0 {
		time.Sleep(d)
	}
}

// locked runs f under the lock after method's delay.
func locked[T any](s *simHost, method string, f func() (T, error)) (T, error) {
	s.begin(method)
	s.mu.Lock()
	defer s.mu.Unlock()
	// fakehost's Calls would grow for ever in a long run.
	s.fake.Calls = s.fake.Calls[:0]
	return f()
}

func lockedErr(s *simHost, method string, f func() error) error {
	_, err := locked(s, method, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// Calls are the calls made so far, by method.
func (s *simHost) Calls() map[string]int64 {
	out := map[string]int64{}
	s.calls.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

// publish hands ev to every subscriber without blocking (libvirt's event
// loop never waits for a subscriber either). Called with the lock held.
func (s *simHost) publish(ev virt.Event) {
	for _, ch := range s.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// Subscribe streams the simulated host's events until ctx ends.
func (s *simHost) Subscribe(ctx context.Context) <-chan virt.Event {
	ch := make(chan virt.Event, 4096)
	s.mu.Lock()
	s.subs = append(s.subs, ch)
	s.mu.Unlock()
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, c := range s.subs {
			if c == ch {
				s.subs = append(s.subs[:i], s.subs[i+1:]...)
				break
			}
		}
		close(ch)
	}()
	return ch
}

// ---- storage: fakehost's, delayed ----

func (s *simHost) EnsurePool(ctx context.Context, spec virt.PoolSpec) error {
	return lockedErr(s, "EnsurePool", func() error { return s.fake.EnsurePool(ctx, spec) })
}

func (s *simHost) ImportImage(ctx context.Context, img virt.ImageImport) (virt.VolumeInfo, error) {
	return locked(s, "ImportImage", func() (virt.VolumeInfo, error) { return s.fake.ImportImage(ctx, img) })
}

func (s *simHost) EnsureOverlay(ctx context.Context, spec virt.OverlaySpec) (virt.VolumeInfo, error) {
	return locked(s, "EnsureOverlay", func() (virt.VolumeInfo, error) { return s.fake.EnsureOverlay(ctx, spec) })
}

func (s *simHost) UploadVolume(ctx context.Context, pool, name string, data []byte) (virt.VolumeInfo, error) {
	return locked(s, "UploadVolume", func() (virt.VolumeInfo, error) {
		info, err := s.fake.UploadVolume(ctx, pool, name, data)
		if err != nil {
			return info, err
		}
		delete(s.fake.Data, pool+"/"+name)
		return info, os.WriteFile(s.volumeFile(pool, name), data, 0o600)
	})
}

func (s *simHost) DeleteVolume(ctx context.Context, pool, name string) error {
	return lockedErr(s, "DeleteVolume", func() error {
		if err := os.Remove(s.volumeFile(pool, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return s.fake.DeleteVolume(ctx, pool, name)
	})
}

func (s *simHost) VolumeInfo(ctx context.Context, pool, name string) (virt.VolumeInfo, error) {
	return locked(s, "VolumeInfo", func() (virt.VolumeInfo, error) { return s.fake.VolumeInfo(ctx, pool, name) })
}

func (s *simHost) ReadVolume(ctx context.Context, pool, name string, limit int64) ([]byte, error) {
	return locked(s, "ReadVolume", func() ([]byte, error) {
		if _, err := s.fake.VolumeInfo(ctx, pool, name); err != nil {
			return nil, err
		}
		f, err := os.Open(s.volumeFile(pool, name))
		if errors.Is(err, fs.ErrNotExist) {
			return s.fake.ReadVolume(ctx, pool, name, limit) // never uploaded: fakehost's answer
		}
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return io.ReadAll(io.LimitReader(f, limit))
	})
}

func (s *simHost) EnsureDataVolume(ctx context.Context, pool, name string, capacity uint64) (virt.VolumeInfo, error) {
	return locked(s, "EnsureDataVolume", func() (virt.VolumeInfo, error) { return s.fake.EnsureDataVolume(ctx, pool, name, capacity) })
}

func (s *simHost) EnsureLogVolume(ctx context.Context, pool, name string) (virt.VolumeInfo, error) {
	return locked(s, "EnsureLogVolume", func() (virt.VolumeInfo, error) { return s.fake.EnsureLogVolume(ctx, pool, name) })
}

func (s *simHost) DeleteLogVolume(ctx context.Context, pool, name string) error {
	return lockedErr(s, "DeleteLogVolume", func() error { return s.fake.DeleteLogVolume(ctx, pool, name) })
}

// ---- domains: fakehost's, delayed, with events and a boot ----

func (s *simHost) EnsureDomain(ctx context.Context, spec virt.DomainSpec) (virt.DomainInfo, error) {
	return locked(s, "EnsureDomain", func() (virt.DomainInfo, error) {
		_, existed := s.fake.Domains[spec.Name]
		d, err := s.fake.EnsureDomain(ctx, spec)
		if err == nil && !existed {
			s.publish(virt.Event{Kind: virt.EventDomainDefined, Domain: d.Name, UUID: d.UUID, Owner: d.Owner})
		}
		return d, err
	})
}

func (s *simHost) StartDomain(ctx context.Context, name string) error {
	return lockedErr(s, "StartDomain", func() error {
		before := s.fake.Domains[name].State
		if err := s.fake.StartDomain(ctx, name); err != nil {
			return err
		}
		d := s.fake.Domains[name]
		if before != "running" {
			s.publish(virt.Event{Kind: virt.EventDomainStarted, Domain: name, UUID: d.UUID, Owner: d.Owner, Detail: "booted"})
			s.boot(name)
		}
		return nil
	})
}

// boot has the guest take its lease and finish its bootstrap after the
// boot delay. Called with the lock held.
func (s *simHost) boot(name string) {
	if t := s.booting[name]; t != nil {
		t.Stop()
	}
	s.booting[name] = time.AfterFunc(s.delays.Boot, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.booting, name)
		d, ok := s.fake.Domains[name]
		spec := s.fake.Specs[name]
		if !ok || d.State != "running" {
			return
		}
		s.fake.Files[name+":"+guest.SentinelPath] = []byte{}
		n := s.networks[spec.Network]
		if n == nil {
			return
		}
		mac := spec.MAC.Canonical()
		for _, e := range n.entries {
			if e.MAC == mac {
				n.leases[mac] = e.IP
				s.publish(virt.Event{Kind: virt.EventLease, Network: spec.Network, MAC: mac, IP: e.IP.String(), Detail: "added"})
				s.publish(virt.Event{Kind: virt.EventAgentConnected, Domain: name, UUID: d.UUID, Owner: d.Owner})
				return
			}
		}
	})
}

func (s *simHost) ShutdownDomain(ctx context.Context, name string, timeout time.Duration) error {
	return lockedErr(s, "ShutdownDomain", func() error {
		d, ok := s.fake.Domains[name]
		if err := s.fake.ShutdownDomain(ctx, name, timeout); err != nil {
			return err
		}
		if ok && d.State == "running" {
			s.stopped(name, d)
		}
		return nil
	})
}

// stopped is what a domain's stop leaves: no lease, no running boot, an
// event. Called with the lock held.
func (s *simHost) stopped(name string, d virt.DomainInfo) {
	if t := s.booting[name]; t != nil {
		t.Stop()
		delete(s.booting, name)
	}
	delete(s.fake.Files, name+":"+guest.SentinelPath)
	spec := s.fake.Specs[name]
	if n := s.networks[spec.Network]; n != nil {
		delete(n.leases, spec.MAC.Canonical())
	}
	s.publish(virt.Event{Kind: virt.EventDomainStopped, Domain: name, UUID: d.UUID, Owner: d.Owner, Detail: "shutdown"})
}

func (s *simHost) DeleteDomain(ctx context.Context, name string) error {
	return lockedErr(s, "DeleteDomain", func() error {
		d, ok := s.fake.Domains[name]
		if ok && d.State == "running" {
			s.stopped(name, d)
		}
		if err := s.fake.DeleteDomain(ctx, name); err != nil {
			return err
		}
		delete(s.fake.Specs, name)
		if ok {
			s.publish(virt.Event{Kind: virt.EventDomainUndefined, Domain: name, UUID: d.UUID, Owner: d.Owner})
		}
		return nil
	})
}

func (s *simHost) DomainInfo(ctx context.Context, name string) (virt.DomainInfo, error) {
	return locked(s, "DomainInfo", func() (virt.DomainInfo, error) { return s.fake.DomainInfo(ctx, name) })
}

func (s *simHost) HostMemory(ctx context.Context) (uint64, error) {
	return locked(s, "HostMemory", func() (uint64, error) { return s.fake.HostMemory(ctx) })
}

func (s *simHost) PCIDevice(ctx context.Context, addr pci.Address) (virt.PCIDeviceInfo, error) {
	return locked(s, "PCIDevice", func() (virt.PCIDeviceInfo, error) { return s.fake.PCIDevice(ctx, addr) })
}

// ---- guest agent ----

func (s *simHost) GuestReadFile(ctx context.Context, domain, path string) ([]byte, error) {
	return locked(s, "GuestReadFile", func() ([]byte, error) { return s.fake.GuestReadFile(ctx, domain, path) })
}

func (s *simHost) GuestWriteFile(ctx context.Context, domain, path string, data []byte, mode os.FileMode) error {
	return lockedErr(s, "GuestWriteFile", func() error { return s.fake.GuestWriteFile(ctx, domain, path, data, mode) })
}

func (s *simHost) GuestExec(context.Context, string, string, []string, []byte) (virt.ExecResult, error) {
	s.begin("GuestExec")
	return virt.ExecResult{}, fmt.Errorf("the simulated host runs no guest programs: %w", virt.ErrAgentUnavailable)
}

func (s *simHost) GuestInterfaces(context.Context, string) ([]virt.GuestInterface, error) {
	s.begin("GuestInterfaces")
	return nil, fmt.Errorf("the simulated host has no guest agent: %w", virt.ErrAgentUnavailable)
}

// ---- listings ----

// ListOwned lists the owned domains, networks and volumes, as the real
// host's listing reads every domain's and network's metadata and every
// volume of its pools.
func (s *simHost) ListOwned(context.Context) ([]virt.OwnedObject, error) {
	return locked(s, "ListOwned", func() ([]virt.OwnedObject, error) {
		var out []virt.OwnedObject
		for _, d := range s.fake.Domains {
			if d.Owner == nil {
				continue
			}
			owner := *d.Owner
			out = append(out, virt.OwnedObject{Kind: virt.OwnedDomain, Name: d.Name, Owner: &owner,
				VCPUs: int64(d.VCPUs), MemoryMiB: int64(d.MemoryMiB)})
		}
		for name, n := range s.networks {
			if n.info.Owner != nil {
				owner := *n.info.Owner
				out = append(out, virt.OwnedObject{Kind: virt.OwnedNetwork, Name: name, Owner: &owner})
			}
		}
		for _, v := range s.fake.Volumes {
			if strings.HasPrefix(v.Name, "capl") {
				out = append(out, virt.OwnedObject{Kind: virt.OwnedVolume, Name: v.Name, Pool: v.Pool,
					CapacityBytes: v.CapacityBytes, AllocationBytes: v.AllocationBytes})
			}
		}
		return out, nil
	})
}

// ---- networks ----

func (s *simHost) EnsureNetwork(_ context.Context, spec virt.NetworkSpec) (virt.NetworkInfo, error) {
	return locked(s, "EnsureNetwork", func() (virt.NetworkInfo, error) {
		if n, ok := s.networks[spec.Name]; ok {
			return n.info, nil
		}
		cidr := spec.CIDR
		if !cidr.IsValid() {
			s.subnet++
			cidr = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + s.subnet/256), byte(s.subnet % 256), 0}), 24)
		}
		owner := spec.Owner
		bridge := spec.Bridge
		if bridge == "" {
			bridge = netalloc.BridgeName(spec.Name)
		}
		gw := cidr.Masked().Addr().Next()
		n := &simNetwork{info: virt.NetworkInfo{Name: spec.Name, Bridge: bridge, CIDR: cidr.Masked(), Gateway: gw,
			Managed: true, DHCP: true, Owner: &owner}, leases: map[netalloc.MAC]netip.Addr{}}
		s.networks[spec.Name] = n
		return n.info, nil
	})
}

func (s *simHost) UseNetwork(_ context.Context, name string) (virt.NetworkInfo, error) {
	return locked(s, "UseNetwork", func() (virt.NetworkInfo, error) {
		n, ok := s.networks[name]
		if !ok {
			return virt.NetworkInfo{}, fmt.Errorf("network %s: %w", name, virt.ErrNotFound)
		}
		return n.info, nil
	})
}

func (s *simHost) UseBridge(context.Context, string) (virt.NetworkInfo, error) {
	s.begin("UseBridge")
	return virt.NetworkInfo{}, fmt.Errorf("the simulated host has no bridges: %w", virt.ErrNotFound)
}

func (s *simHost) DeleteNetwork(_ context.Context, name string) error {
	return lockedErr(s, "DeleteNetwork", func() error {
		delete(s.networks, name)
		return nil
	})
}

func (s *simHost) network(name string) (*simNetwork, error) {
	n, ok := s.networks[name]
	if !ok {
		return nil, fmt.Errorf("network %s: %w", name, virt.ErrNotFound)
	}
	return n, nil
}

// dhcpRange is the network's DHCP range: all but the gateway and broadcast.
func (n *simNetwork) dhcpRange() virt.AddressRange {
	p := n.info.CIDR
	last := p.Addr()
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		last = a
	}
	return virt.AddressRange{Start: n.info.Gateway.Next(), End: last.Prev()}
}

func (s *simHost) ReserveAddress(_ context.Context, network string, r virt.Reservation) (netip.Addr, error) {
	return locked(s, "ReserveAddress", func() (netip.Addr, error) {
		n, err := s.network(network)
		if err != nil {
			return netip.Addr{}, err
		}
		r.MAC = r.MAC.Canonical()
		used := []netip.Addr{n.info.Gateway}
		for _, e := range n.entries {
			if e.MAC == r.MAC {
				return e.IP, nil
			}
			used = append(used, e.IP)
		}
		ip := r.IP
		if !ip.IsValid() {
			if ip, err = netalloc.NextFreeAddress(n.info.CIDR, used); err != nil {
				return netip.Addr{}, err
			}
		}
		r.IP = ip
		n.entries = append(n.entries, r)
		return ip, nil
	})
}

func (s *simHost) release(method, network string, mac netalloc.MAC) error {
	return lockedErr(s, method, func() error {
		n, ok := s.networks[network]
		if !ok {
			return nil
		}
		mac = mac.Canonical()
		keep := n.entries[:0]
		for _, e := range n.entries {
			if e.MAC != mac {
				keep = append(keep, e)
			}
		}
		n.entries = keep
		return nil
	})
}

func (s *simHost) ReleaseAddress(_ context.Context, network string, mac netalloc.MAC) error {
	return s.release("ReleaseAddress", network, mac)
}

func (s *simHost) ReleaseOwnedAddress(_ context.Context, network string, r virt.Reservation) error {
	return s.release("ReleaseOwnedAddress", network, r.MAC)
}

func (s *simHost) Reservations(_ context.Context, network string) ([]virt.Reservation, error) {
	return locked(s, "Reservations", func() ([]virt.Reservation, error) {
		n, err := s.network(network)
		if err != nil {
			return nil, err
		}
		return append([]virt.Reservation(nil), n.entries...), nil
	})
}

// SegmentUse reports the network's entries and leases and the domains on
// it, as the real host finds them by reading every domain's XML.
func (s *simHost) SegmentUse(_ context.Context, network, bridge string) (virt.SegmentUse, error) {
	return locked(s, "SegmentUse", func() (virt.SegmentUse, error) {
		var use virt.SegmentUse
		if network != "" {
			n, err := s.network(network)
			if err != nil {
				return use, err
			}
			use.Own = []netip.Addr{n.info.Gateway}
			use.DHCPRanges = []virt.AddressRange{n.dhcpRange()}
			use.Reservations = append(use.Reservations, n.entries...)
			for mac, ip := range n.leases {
				use.Leases = append(use.Leases, leases.Lease{MAC: mac, IP: ip})
			}
		}
		for name, spec := range s.fake.Specs {
			if (network != "" && spec.Network == network) || (bridge != "" && spec.Bridge == bridge) {
				owner := spec.Owner
				use.Domains = append(use.Domains, virt.SegmentDomain{Name: name, Owner: &owner,
					MACs: []netalloc.MAC{spec.MAC.Canonical()}, Addresses: spec.StaticAddresses})
			}
		}
		return use, nil
	})
}

func (s *simHost) Addresses(_ context.Context, q virt.AddressQuery) ([]virt.Address, error) {
	return locked(s, "Addresses", func() ([]virt.Address, error) {
		n, ok := s.networks[q.Network]
		if q.Network == "" || !ok {
			return nil, virt.ErrAgentUnavailable
		}
		var out []virt.Address
		mac := q.MAC.Canonical()
		if ip, ok := n.leases[mac]; ok {
			out = append(out, virt.Address{IP: ip, Source: virt.AddressSourceLease})
		}
		for _, e := range n.entries {
			if e.MAC == mac && (len(out) == 0 || out[0].IP != e.IP) {
				out = append(out, virt.Address{IP: e.IP, Source: virt.AddressSourceReservation})
			}
		}
		return out, nil
	})
}

func (s *simHost) WatchLease(context.Context, string, netalloc.MAC) error {
	s.begin("WatchLease")
	return nil // every lease is published
}
