// Package address reserves a VM's IP for its MAC in the network's DHCP
// server, choosing and persisting that MAC first.
package address

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// macCandidates bounds how many derived MACs are tried before giving up.
const macCandidates = segment.MACCandidates

// waitForNetwork is how often a machine whose network is not there yet
// looks again (no watch covers the LibvirtCluster's status.network).
const waitForNetwork = 30 * time.Second

// Service reserves the address; its outcome is AddressReserved's.
type Service struct {
	vm   *scope.VM
	host virt.NetworkHost
	// others are the other libvirt hosts whose domains on the segment
	// the MAC must not collide with.
	others segment.Hosts
	// reserved is the address Reconcile reserved; invalid when the
	// network has none to give (a bridge, no libvirt DHCP).
	reserved netip.Addr
}

var _ services.Service = (*Service)(nil)

// New returns the address reservation service of vm.
func New(vm *scope.VM, host virt.NetworkHost) *Service { return &Service{vm: vm, host: host} }

// WithOtherHosts has the MAC checked against the domains of the other
// libvirt hosts the manager reaches too.
func (svc *Service) WithOtherHosts(others segment.Hosts) *Service {
	svc.others = others
	return svc
}

func (*Service) Name() string { return "address" }

// Reserved is the address the last Reconcile reserved; invalid when the
// network reserves none (a host bridge, a network without libvirt DHCP).
func (svc *Service) Reserved() netip.Addr { return svc.reserved }

// Reconcile chooses the MAC (persisting it and the placement before
// anything exists in libvirt) and reserves an address for it.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.reserved = netip.Addr{}
	network := vm.Network
	if network.IsZero() {
		return services.Result{}, services.Fail(infrav1.WaitingForNetworkReason, services.Requeue(waitForNetwork, "cluster network unknown"),
			"The LibvirtCluster has not reported its network yet")
	}
	if err := svc.ensureMAC(ctx, network); err != nil {
		return services.Result{}, err
	}
	// The MAC is the object's to write: before it reaches a DHCP entry
	// or a domain, it must be one the provider derived, or one this VM's
	// own domain already uses, and no other domain's on the segment.
	if err := segment.New(vm, svc.host, svc.others).CheckMAC(ctx); err != nil {
		return services.Result{}, err
	}
	switch vm.Addressing {
	case scope.AddressingPool:
		// The IPAM step that follows reports the addresses.
		return services.Result{}, nil
	case scope.AddressingLAN:
		return services.Done(infrav1.ReservationNotSupportedReason,
			fmt.Sprintf("Host bridge %s: the address comes from the LAN's DHCP server", network.Bridge)), nil
	}
	owner := vm.Owner
	ip, err := svc.host.ReserveAddress(ctx, network.Name, virt.Reservation{MAC: vm.MAC, Owner: &owner})
	var conflict *virt.AddressConflictError
	switch {
	case err == nil:
		svc.reserved = ip
		return services.Done(infrav1.ReadyReason, fmt.Sprintf("%s is reserved for %s on network %s", ip, vm.MAC, network.Name)), nil
	case errors.Is(err, virt.ErrNoDHCP):
		return services.Done(infrav1.ReservationNotSupportedReason,
			fmt.Sprintf("libvirt serves no DHCP on network %s: the guest agent reports the address", network.Name)), nil
	case virt.IsNotFound(err):
		return services.Result{}, services.Fail(infrav1.WaitingForNetworkReason, services.Requeue(waitForNetwork, "network missing"),
			"Network %s does not exist", network.Name)
	case errors.As(err, &conflict):
		if !conflict.Until.IsZero() {
			err = services.Requeue(time.Until(conflict.Until)+time.Second, "address leased to another MAC")
		}
		return services.Result{}, services.Fail(infrav1.AddressConflictReason, err, "%s", conflict.Error())
	default:
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Reserving an address: %v", err)
	}
}

// ensureMAC chooses the NIC's MAC once: the first of the candidates derived
// from the domain's UUID that no other host entry of the network uses. It is patched
// onto the object, together with the pool and network, before the
// reservation is made, so a crash never leaves an entry we cannot name.
func (svc *Service) ensureMAC(ctx context.Context, network scope.NetworkRef) error {
	vm := svc.vm
	if vm.MAC != "" {
		return nil
	}
	var taken []virt.Reservation
	if network.Name != "" {
		var err error
		taken, err = svc.host.Reservations(ctx, network.Name)
		switch {
		case errors.Is(err, virt.ErrNoDHCP):
		case virt.IsNotFound(err):
			return services.Fail(infrav1.WaitingForNetworkReason, services.Requeue(waitForNetwork, "network missing"),
				"Network %s does not exist", network.Name)
		case err != nil:
			return services.Fail(infrav1.LibvirtErrorReason, err, "Listing reservations: %v", err)
		}
	}
	if vm.UUID == "" {
		return fmt.Errorf("choosing a MAC: the VM has no domain UUID yet (the identity step runs first)")
	}
	var mac netalloc.MAC
	for _, c := range naming.MACCandidates(vm.UUID, macCandidates) {
		if !reserved(taken, c) {
			mac = c
			break
		}
	}
	if mac == "" {
		return services.Fail(infrav1.AddressConflictReason, fmt.Errorf("no free MAC among %d candidates", macCandidates),
			"All %d MACs derived for this machine are reserved on network %s", macCandidates, network.Name)
	}
	vm.MAC = mac
	vm.RecordPlacement()
	return vm.Persist(ctx)
}

func reserved(entries []virt.Reservation, mac netalloc.MAC) bool {
	for _, e := range entries {
		if e.MAC == mac {
			return true
		}
	}
	return false
}

// Delete removes the VM's host entry, if it is the VM's own: a MAC
// recorded on the object is the tenant's to write, and deleting it must
// not take another VM's reservation away. A VM whose MAC was never
// recorded made no reservation.
func (svc *Service) Delete(ctx context.Context) error {
	vm := svc.vm
	network := vm.Network
	if vm.MAC == "" || network.Name == "" {
		return nil
	}
	owner := vm.Owner
	if err := svc.host.ReleaseOwnedAddress(ctx, network.Name, virt.Reservation{MAC: vm.MAC, Owner: &owner}); err != nil {
		return fmt.Errorf("releasing the address of %s: %w", vm.MAC, err)
	}
	return nil
}
