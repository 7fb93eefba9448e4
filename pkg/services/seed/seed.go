// Package seed turns a VM's user-data (a machine's bootstrap Secret, or
// what the load balancer generates) into a NoCloud seed ISO volume. The bootstrap data only ever lives in memory and in that 0600
// volume: never in a log line, an event, a condition or a local file.
package seed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// FormatCloudConfig is the only bootstrap data format supported.
const FormatCloudConfig = "cloud-config"

// recheckSecret is how often a missing bootstrap Secret is looked for; the
// bootstrap provider normally creates it before naming it.
const recheckSecret = 30 * time.Second

// Service writes the seed; its outcome is BootstrapDataReady's.
type Service struct {
	vm   *scope.VM
	host virt.StorageHost
	// userData returns the seed's user-data: the machine's bootstrap
	// Secret, or what the caller generated.
	userData func(context.Context) ([]byte, error)
	// networkConfig returns the seed's network-config; nil or empty for
	// none (cloud-init's DHCP on the first NIC).
	networkConfig func() ([]byte, error)
	// vendorData is the seed's vendor-data; empty for none.
	vendorData []byte
	// domainDefined tells whether the VM's domain exists (the identity
	// step's answer): it was defined on the seed; nil: it is taken not to.
	domainDefined func() bool
	// volume is what the last Reconcile ensured.
	volume *virt.VolumeInfo
}

var _ services.Service = (*Service)(nil)

// New returns the seed service of s's VM, whose user-data is the Machine's
// bootstrap data. Its vendor-data keeps the bootstrap's sentinel through
// reboots (cloudinit.BootstrapSentinelVendorData), which the bootstrap
// check relies on when the guest went down before the sentinel was read.
// Its network-config (WithNetworkConfig) gives a VM with IPAM addresses
// those addresses; cloud-init renders it once per instance, so the emptied
// seed of Removal does without it.
func New(s *scope.MachineScope, host virt.StorageHost) *Service {
	return &Service{vm: s.VM, host: host, userData: func(ctx context.Context) ([]byte, error) { return bootstrapData(ctx, s) },
		vendorData: []byte(cloudinit.BootstrapSentinelVendorData)}
}

// NewWithUserData returns the seed service of a VM whose user-data the
// caller generates (the load balancer's). It must not be secret: it is not
// read from a Secret and may be rebuilt at any time.
func NewWithUserData(vm *scope.VM, host virt.StorageHost, userData []byte) *Service {
	return &Service{vm: vm, host: host, userData: func(context.Context) ([]byte, error) { return userData, nil }}
}

// WithNetworkConfig gives the seed a network-config document, which
// networkConfig returns when the seed is built; like generated user-data
// it must not be secret.
func (svc *Service) WithNetworkConfig(networkConfig func() ([]byte, error)) *Service {
	svc.networkConfig = networkConfig
	return svc
}

// WithDomainDefined has the seed taken as complete, without reading it,
// once defined says the VM's domain exists: the domain was defined on it.
func (svc *Service) WithDomainDefined(defined func() bool) *Service {
	svc.domainDefined = defined
	return svc
}

func (*Service) Name() string { return "seed" }

// Volume is the seed's volume as the last Reconcile ensured it, which the
// domain step defines the domain on; nil when it did not run or stopped.
func (svc *Service) Volume() *virt.VolumeInfo { return svc.volume }

// Reconcile uploads the seed unless libvirt holds it complete: the VM's
// domain exists (it was defined on the seed), or the volume holds
// the seed's bytes (holds; BuildISO is deterministic). Anything else is written
// again: an upload cut short by a crash, or a seed of another instance-id
// (made before the VM's UUID was chosen). Once the domain exists the
// Secret is not read again.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.volume = nil
	pool := vm.Pool.Name
	info, err := svc.host.VolumeInfo(ctx, pool, vm.SeedVolume())
	switch {
	case err == nil && svc.domainDefined != nil && svc.domainDefined():
		svc.volume = &info
		return services.Done(infrav1.ReadyReason, ""), nil
	case err != nil && !virt.IsNotFound(err):
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Looking up the seed volume: %v", err)
	}
	exists := err == nil
	userData, err := svc.userData(ctx)
	if err != nil {
		return services.Result{}, err
	}
	var networkConfig []byte
	if svc.networkConfig != nil {
		if networkConfig, err = svc.networkConfig(); err != nil {
			return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, services.Requeue(0, "invalid network-config"), "Building the seed: %v", err)
		}
	}
	iso, err := cloudinit.BuildISO(cloudinit.Seed{
		InstanceID:    vm.UUID,
		LocalHostname: vm.Hostname,
		UserData:      userData,
		NetworkConfig: networkConfig,
		VendorData:    svc.vendorData,
	})
	if err != nil {
		// Validation errors name the instance-id and hostname only.
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, services.Requeue(0, "invalid seed"), "Building the seed: %v", err)
	}
	if exists {
		// A failed read is an unknown seed: written again.
		if complete, err := holds(ctx, svc.host, pool, vm.SeedVolume(), iso); err == nil && complete {
			svc.volume = &info
			return services.Done(infrav1.ReadyReason, ""), nil
		}
	}
	info, err = svc.host.UploadVolume(ctx, pool, vm.SeedVolume(), iso)
	if err != nil {
		reason := infrav1.LibvirtErrorReason
		if errors.Is(err, virt.ErrPoolFull) {
			reason = infrav1.PoolFullReason
		}
		return services.Result{}, services.Fail(reason, err, "Uploading the seed: %v", err)
	}
	svc.volume = &info
	return services.Done(infrav1.ReadyReason, ""), nil
}

// Removal takes the bootstrap data off the host once the guest used it:
// the seed is rewritten with the same instance-id and hostname and empty
// user-data, so a reboot neither re-runs the bootstrap (cloud-init sees
// the same instance) nor finds a join token or certificate key, and the
// host keeps neither for the machine's life. It runs after the bootstrap
// check, also once the machine is provisioned.
type Removal struct {
	vm   *scope.VM
	host virt.StorageHost
	// succeeded tells whether the bootstrap check of this reconcile found
	// the bootstrap done.
	succeeded func() bool
}

var _ services.Service = (*Removal)(nil)

// NewRemoval returns the bootstrap data removal of vm, once succeeded (the
// bootstrap check's answer) says the bootstrap is done.
func NewRemoval(vm *scope.VM, host virt.StorageHost, succeeded func() bool) *Removal {
	return &Removal{vm: vm, host: host, succeeded: succeeded}
}

func (*Removal) Name() string { return "bootstrap data removal" }

// Reconcile rewrites the seed once bootstrap succeeded, and then never
// again: a steady machine costs no libvirt call here.
func (r *Removal) Reconcile(ctx context.Context) (services.Result, error) {
	vm := r.vm
	if !r.succeeded() || vm.BootstrapDataRemoved {
		return services.Result{}, nil
	}
	iso, err := emptySeed(vm)
	if err != nil {
		return services.Result{}, err
	}
	// Padded to the volume's size (ISO 9660 readers stop at the volume's
	// end), the volume is overwritten in place rather than replaced: the
	// running QEMU, which keeps the file open, and the guest after a
	// reboot see the new bytes, and no unlinked copy of the old ones stays
	// on disk while the domain runs.
	if info, err := r.host.VolumeInfo(ctx, vm.Pool.Name, vm.SeedVolume()); err == nil && info.CapacityBytes > uint64(len(iso)) {
		iso = append(iso, make([]byte, info.CapacityBytes-uint64(len(iso)))...)
	}
	if _, err := r.host.UploadVolume(ctx, vm.Pool.Name, vm.SeedVolume(), iso); err != nil {
		return services.Result{}, fmt.Errorf("removing the bootstrap data from the seed: %w", err)
	}
	vm.BootstrapDataRemoved = true
	vm.Event(corev1.EventTypeNormal, "BootstrapDataRemoved", "The seed no longer holds the bootstrap data: bootstrap succeeded")
	return services.Result{}, nil
}

// Delete does nothing: the seed step removes the volume.
func (*Removal) Delete(context.Context) error { return nil }

// emptySeed is the seed Removal writes: the machine's instance-id and
// hostname, no user-data. BuildISO is deterministic, so it is also what
// the volume starts with once the data was removed. It has no vendor-data
// either: cloud-init ran that once for the instance, and what it installed
// stays on the guest's disk. Without it the bytes are those that releases
// before the vendor-data wrote, so Emptied recognises their machines too.
func emptySeed(vm *scope.VM) ([]byte, error) {
	iso, err := cloudinit.BuildISO(cloudinit.Seed{InstanceID: vm.UUID, LocalHostname: vm.Hostname})
	if err != nil {
		return nil, fmt.Errorf("building the seed without bootstrap data: %w", err)
	}
	return iso, nil
}

// Emptied tells whether the machine's seed volume holds the seed Removal
// writes, which it does only after the bootstrap succeeded. That fact is
// in libvirt, where nothing loses it: the sentinel the bootstrap leaves is
// in the guest's /run, gone after a reboot where the vendor-data did not
// keep it (seeds of older releases, user-data that disables vendor data),
// and BootstrapSucceeded in status (gone after clusterctl move or a
// restore).
func Emptied(ctx context.Context, vm *scope.VM, host virt.StorageHost) (bool, error) {
	iso, err := emptySeed(vm)
	if err != nil {
		return false, err
	}
	return holds(ctx, host, vm.Pool.Name, vm.SeedVolume(), iso)
}

// holds tells whether a seed volume holds iso: its first bytes are iso,
// and what may follow are the zeros Removal pads with (ISO 9660 readers
// stop at the end the image records). A missing volume holds nothing.
func holds(ctx context.Context, host virt.StorageHost, pool, volume string, iso []byte) (bool, error) {
	data, err := host.ReadVolume(ctx, pool, volume, int64(len(iso)))
	if virt.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return bytes.Equal(data, iso), nil
}

// bootstrapData reads value and format from the Machine's bootstrap Secret.
func bootstrapData(ctx context.Context, s *scope.MachineScope) ([]byte, error) {
	name := s.BootstrapDataSecretName()
	if name == nil {
		return nil, services.Fail(infrav1.WaitingForBootstrapDataReason, services.Requeue(0, "no bootstrap data"), "Waiting for the bootstrap provider")
	}
	secret := &corev1.Secret{}
	err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace(), Name: *name}, secret)
	if apierrors.IsNotFound(err) {
		return nil, services.Fail(infrav1.BootstrapSecretNotFoundReason, services.Requeue(recheckSecret, "bootstrap secret missing"),
			"Bootstrap Secret %s not found", *name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading bootstrap Secret %s: %w", *name, err)
	}
	value, ok := secret.Data["value"]
	if !ok || len(value) == 0 {
		return nil, services.Fail(infrav1.BootstrapSecretNotFoundReason, services.Requeue(recheckSecret, "bootstrap secret empty"),
			"Bootstrap Secret %s has no value", *name)
	}
	if format := strings.TrimSpace(string(secret.Data["format"])); format != "" && format != FormatCloudConfig {
		// The format is a short keyword, not bootstrap data; cap it anyway.
		if len(format) > 32 {
			format = format[:32] + "…"
		}
		return nil, services.Fail(infrav1.UnsupportedBootstrapFormatReason, services.Requeue(2*recheckSecret, "unsupported bootstrap format"),
			"Bootstrap Secret %s has format %q; only %s is supported", *name, format, FormatCloudConfig)
	}
	return value, nil
}

// Delete removes the seed volume.
func (svc *Service) Delete(ctx context.Context) error {
	if err := svc.host.DeleteVolume(ctx, svc.vm.Pool.Name, svc.vm.SeedVolume()); err != nil {
		return fmt.Errorf("deleting the seed: %w", err)
	}
	return nil
}
