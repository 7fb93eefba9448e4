// Package domain defines and starts a VM's libvirt domain, watches over it
// once provisioned, and shuts it down and removes it on delete.
package domain

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// DefaultShutdownTimeout bounds the graceful shutdown on delete before
// the domain is destroyed.
const DefaultShutdownTimeout = 30 * time.Second

// ErrVolumesUnknown is a domain to define whose root disk, seed, data
// disks or host devices the steps before it have not handed over in this
// reconcile.
var ErrVolumesUnknown = errors.New("the root disk, seed, data disks and host devices were not ensured in this reconcile")

// Parts are what the steps before the domain step made of the VM in this
// reconcile, which the domain is defined with; each returns nil when its
// step did not run (once the VM is provisioned) or stopped.
type Parts struct {
	// RootDisk and Seed are the disk and seed steps' volumes.
	RootDisk, Seed func() *virt.VolumeInfo
	// DataDisks are the data disk step's volumes, in the VM's DataDisks
	// order.
	DataDisks func() []virt.VolumeInfo
	// HostDevices are the host device step's PCI addresses, in the VM's
	// HostDevices order.
	HostDevices func() []pci.Address
	// StaticAddresses are the IPAM step's addresses, which the traffic
	// filter pins the NIC to.
	StaticAddresses func() []cloudinit.StaticAddress
	// Found is the domain as the identity step found it, which is not read
	// again; nil (or a nil func) when it did not look: the step reads it.
	Found func() *virt.DomainInfo
}

// Host is what the service needs of the libvirt host: its domains, and
// the pool that keeps the serial console's log.
type Host interface {
	virt.DomainHost
	virt.StorageHost
}

// Options are the operator's settings of the domains.
type Options struct {
	// ShutdownTimeout bounds the graceful shutdown on delete; zero means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// TrafficFilter is the nwfilter of NICs on a shared segment: a host
	// bridge or a libvirt network the provider did not make for the
	// cluster (tenancy.Policy.TrafficFilter); empty for none.
	TrafficFilter string
	// Drain, when set, runs first on delete, before the domain is shut
	// down: a control-plane machine leaves the cluster's load balancer.
	// It returns nil once done, a services.RequeueError to wait.
	Drain func(ctx context.Context) error
}

// Service runs the domain; its outcome is DomainReady's.
type Service struct {
	vm *scope.VM
	// domains defines, starts and stops the VM; volumes holds its console log.
	domains virt.DomainHost
	volumes virt.StorageHost
	parts   Parts
	opts    Options
}

var _ services.Service = (*Service)(nil)

// New returns the domain service of vm, defined with parts.
func New(vm *scope.VM, host Host, parts Parts, opts Options) *Service {
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	return &Service{vm: vm, domains: host, volumes: host, parts: parts, opts: opts}
}

// Reconcile makes the domain exist with the provider-chosen UUID and run.
// Before provisioning, a missing domain is defined and a stopped one
// started. After provisioning, a missing or replaced domain, or one that
// stopped and cannot be started again, is a terminal failure: recreating
// it would silently give the Machine a fresh, unbootstrapped disk.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	s := svc.vm
	info, err := svc.lookup(ctx)
	switch {
	case virt.IsNotFound(err) && s.Provisioned:
		return services.Result{}, services.Terminal(scope.FailureReasonUpdate, infrav1.DomainMissingReason,
			"Domain %s vanished after the machine was provisioned", s.Domain)
	case virt.IsNotFound(err):
		if info, err = svc.define(ctx); err != nil {
			return services.Result{}, err
		}
	case err != nil:
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Reading domain %s: %v", s.Domain, err)
	}
	if !strings.EqualFold(info.UUID, s.UUID) {
		return services.Result{}, svc.replaced(&virt.DomainReplacedError{Name: s.Domain, ExpectedUUID: s.UUID, ActualUUID: info.UUID})
	}
	s.State = info.State
	switch info.State {
	case "running":
	case "paused":
		return services.Result{}, services.Fail(infrav1.DomainPausedReason, services.Requeue(time.Minute, "domain paused"),
			"Domain %s is paused (%s)", s.Domain, info.Reason)
	case "shutdown":
		return services.Result{}, services.Fail(infrav1.DomainCrashedReason, services.Requeue(0, "domain shutting down"),
			"Domain %s is shutting down", s.Domain)
	default: // shutoff, crashed, pmsuspended…
		if err := svc.start(ctx, info); err != nil {
			return services.Result{}, err
		}
		s.State = "running"
	}
	return svc.hardwareResult(info), nil
}

func (*Service) Name() string { return "domain" }

// lookup is the domain as the identity step of this reconcile found it,
// else as libvirt reports it now.
func (svc *Service) lookup(ctx context.Context) (virt.DomainInfo, error) {
	if svc.parts.Found != nil {
		if found := svc.parts.Found(); found != nil {
			return *found, nil
		}
	}
	return svc.domains.DomainInfo(ctx, svc.vm.Domain)
}

// define creates the domain on the overlay and seed volumes, unless the
// host could never hold it.
func (svc *Service) define(ctx context.Context) (virt.DomainInfo, error) {
	s := svc.vm
	if err := svc.checkHostMemory(ctx); err != nil {
		return virt.DomainInfo{}, err
	}
	disk, seed, data, devices := svc.parts.RootDisk(), svc.parts.Seed(), svc.parts.DataDisks(), svc.parts.HostDevices()
	if disk == nil || seed == nil || len(data) != len(s.DataDisks) || len(devices) != len(s.HostDevices) {
		return virt.DomainInfo{}, fmt.Errorf("defining domain %s: %w", s.Domain, ErrVolumesUnknown)
	}
	consoleLog, err := svc.volumes.EnsureLogVolume(ctx, s.Pool.Name, s.ConsoleLogVolume())
	if err != nil {
		return virt.DomainInfo{}, services.Fail(infrav1.LibvirtErrorReason, err, "Creating the console log volume: %v", err)
	}
	hw := s.Hardware
	network := s.Network
	info, err := svc.domains.EnsureDomain(ctx, virt.DomainSpec{
		Name: s.Domain, UUID: s.UUID, Owner: s.Owner,
		Type: string(hw.DomainType), CPUMode: string(hw.CPUMode), CPUModel: hw.CPUModel, CPUFeatures: hw.CPUFeatures,
		VCPUs: uint(hw.CPUs), MemoryMiB: uint64(hw.MemoryMiB), CPUShares: uint(hw.CPUShares),
		TCGCacheMiB: uint64(hw.TCGTranslationCacheMiB), DiskPath: disk.Path, DiskFormat: disk.Format, SeedISOPath: seed.Path,
		DiskBackingPath: disk.BackingPath, DiskBackingFormat: disk.BackingFormat,
		Network: network.Name, Bridge: network.Bridge, MAC: s.MAC, TrafficFilter: svc.trafficFilter(network),
		StaticAddresses: staticAddresses(svc.parts.StaticAddresses()), ConsoleLogPath: consoleLog.Path,
		DataDisks: dataDisks(s, data), HostDevices: devices,
	})
	if errors.Is(err, virt.ErrDomainReplaced) {
		return virt.DomainInfo{}, svc.replaced(err)
	}
	if err != nil {
		return virt.DomainInfo{}, services.Fail(infrav1.LibvirtErrorReason, err, "Defining domain %s: %v", s.Domain, err)
	}
	s.Event("Normal", "DomainDefined", fmt.Sprintf("Defined domain %s with UUID %s", info.Name, info.UUID))
	return info, nil
}

// trafficFilter is the filter of a NIC on network: none on a network the
// provider made for the cluster (its own segment, whose DHCP is libvirt's
// and whose addresses are reserved), the operator's on anything shared.
func (svc *Service) trafficFilter(network scope.NetworkRef) string {
	if _, ours := naming.NameNamespace(network.Name); ours {
		return ""
	}
	return svc.opts.TrafficFilter
}

// checkHostMemory refuses a VM asking more memory than the libvirt host
// has in total. libvirt would define it, and QEMU would start it and then
// be killed or swap the host to a crawl once the guest touches its memory;
// the spec's memory is immutable, so this never resolves by waiting.
// Memory in use by other VMs is not counted: it changes all the time and
// the kernel overcommits, so only the impossible is refused.
func (svc *Service) checkHostMemory(ctx context.Context) error {
	s := svc.vm
	total, err := svc.domains.HostMemory(ctx)
	if err != nil {
		return services.Fail(infrav1.LibvirtErrorReason, err, "Reading the libvirt host's memory: %v", err)
	}
	asked := uint64(s.Hardware.MemoryMiB)
	if asked<<20 <= total {
		return nil
	}
	return services.Terminal(scope.FailureReasonCreate, infrav1.InsufficientHostMemoryReason,
		"memoryMiB %d MiB exceeds the libvirt host's total memory %.1f GiB", asked, float64(total)/(1<<30))
}

// start starts a defined, stopped domain. After provisioning, a domain
// that cannot start again is a terminal failure.
func (svc *Service) start(ctx context.Context, info virt.DomainInfo) error {
	s := svc.vm
	err := svc.domains.StartDomain(ctx, s.Domain)
	var startErr *virt.DomainStartError
	switch {
	case err == nil:
		if s.Provisioned {
			s.Event("Warning", "DomainRestarted", fmt.Sprintf("Domain %s was %s (%s) and was started again", s.Domain, info.State, info.Reason))
		} else {
			s.Event("Normal", "DomainStarted", fmt.Sprintf("Started domain %s", s.Domain))
		}
		return nil
	case errors.As(err, &startErr) && s.Provisioned:
		return services.Terminal(scope.FailureReasonUpdate, infrav1.DomainCrashedReason, "Domain %s was %s (%s) and cannot be started again: %s",
			s.Domain, info.State, info.Reason, startErr.Message)
	case errors.As(err, &startErr):
		return services.Fail(infrav1.DomainFailedToStartReason, err, "%s", startErr.Message)
	default:
		return services.Fail(infrav1.LibvirtErrorReason, err, "Starting domain %s: %v", s.Domain, err)
	}
}

// replaced handles a domain of our name with a foreign UUID.
func (svc *Service) replaced(err error) error {
	if svc.vm.Provisioned {
		return services.Terminal(scope.FailureReasonUpdate, infrav1.DomainMissingReason, "%v", err)
	}
	return services.Fail(infrav1.DomainMissingReason, err, "%v", err)
}

// hardwareResult is DomainReady True, saying so when CPUs or memory
// differ from the spec. The VM is never recreated to fix that: its disk
// holds a bootstrapped node.
func (svc *Service) hardwareResult(info virt.DomainInfo) services.Result {
	hw := svc.vm.Hardware
	if info.VCPUs != uint(hw.CPUs) || info.MemoryMiB != uint64(hw.MemoryMiB) {
		return services.Done(infrav1.HardwareDriftReason, fmt.Sprintf(
			"Domain runs with %d vCPUs and %d MiB, the spec asks for %d and %d; replace the Machine to apply the spec",
			info.VCPUs, info.MemoryMiB, hw.CPUs, hw.MemoryMiB))
	}
	return services.Done(infrav1.ReadyReason, "")
}

// Delete shuts the domain down (bounded), then destroys and undefines it,
// and removes its console log: kubeadm's output, tokens included, must not
// outlive the machine. A domain of our name with another UUID is not ours
// and is left alone, with the log of our name.
func (svc *Service) Delete(ctx context.Context) error {
	s := svc.vm
	if svc.opts.Drain != nil {
		if err := svc.opts.Drain(ctx); err != nil {
			return err
		}
	}
	info, err := svc.domains.DomainInfo(ctx, s.Domain)
	switch {
	case virt.IsNotFound(err):
		return svc.deleteConsoleLog(ctx)
	case err != nil:
		return fmt.Errorf("reading domain %s: %w", s.Domain, err)
	case !svc.owns(info):
		s.Event("Warning", "DomainNotOwned", fmt.Sprintf("Domain %s has UUID %s, not %s: leaving it alone", s.Domain, info.UUID, s.UUID))
		return nil
	}
	if err := svc.domains.ShutdownDomain(ctx, s.Domain, svc.opts.ShutdownTimeout); err != nil {
		return fmt.Errorf("shutting down domain %s: %w", s.Domain, err)
	}
	if err := svc.domains.DeleteDomain(ctx, s.Domain); err != nil {
		return fmt.Errorf("deleting domain %s: %w", s.Domain, err)
	}
	return svc.deleteConsoleLog(ctx)
}

// owns tells whether the domain found under the VM's name is the VM's: its
// UUID is the one chosen, or, for a VM deleted before it chose one, its
// ownership metadata names the VM.
func (svc *Service) owns(info virt.DomainInfo) bool {
	s := svc.vm
	if id := s.UUID; id != "" {
		return strings.EqualFold(info.UUID, id)
	}
	return info.Owner.IsObject(s.Owner)
}

func (svc *Service) deleteConsoleLog(ctx context.Context) error {
	s := svc.vm
	if err := svc.volumes.DeleteLogVolume(ctx, s.Pool.Name, s.ConsoleLogVolume()); err != nil {
		return fmt.Errorf("deleting the console log: %w", err)
	}
	return nil
}

// dataDisks are the VM's data disk volumes as the domain attaches them:
// each with its name as serial.
func dataDisks(vm *scope.VM, volumes []virt.VolumeInfo) []virt.DataDisk {
	var out []virt.DataDisk
	for i, v := range volumes {
		out = append(out, virt.DataDisk{Path: v.Path, Serial: vm.DataDisks[i].Name})
	}
	return out
}

// staticAddresses are the addresses the VM's IPAM step read, which the
// traffic filter pins the NIC to.
func staticAddresses(addresses []cloudinit.StaticAddress) []netip.Addr {
	var out []netip.Addr
	for _, a := range addresses {
		out = append(out, a.Prefix.Addr())
	}
	return out
}
