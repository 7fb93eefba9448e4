// Package address reserves the machine's IP for its MAC in the network's
// DHCP server, choosing and persisting that MAC first.
package address

import (
	"context"
	"errors"
	"fmt"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// macCandidates bounds how many derived MACs are tried before giving up.
const macCandidates = 8

// waitForNetwork is how often a machine whose network is not there yet
// looks again (no watch covers the LibvirtCluster's status.network).
const waitForNetwork = 30 * time.Second

// Service owns the AddressReserved condition.
type Service struct{ scope scope.VM }

var _ services.Service = (*Service)(nil)

// New returns the address reservation service of s.
func New(s scope.VM) *Service { return &Service{scope: s} }

// Reconcile chooses the MAC (persisting it and the placement before
// anything exists in libvirt) and reserves an address for it.
func (svc *Service) Reconcile(ctx context.Context) error {
	s := svc.scope
	network := s.Network()
	if network.IsZero() {
		s.MarkFalse(infrav1.AddressReservedCondition, infrav1.WaitingForNetworkReason,
			"The LibvirtCluster has not reported its network yet")
		return services.Requeue(waitForNetwork, "cluster network unknown")
	}
	if err := svc.ensureMAC(ctx, network); err != nil {
		return err
	}
	if network.Bridge != "" {
		s.MarkTrue(infrav1.AddressReservedCondition, infrav1.ReservationNotSupportedReason,
			fmt.Sprintf("Host bridge %s: the address comes from the LAN's DHCP server", network.Bridge))
		return nil
	}
	ip, err := s.LibvirtHost().ReserveAddress(ctx, network.Name, virt.Reservation{MAC: s.MAC()})
	var conflict *virt.AddressConflictError
	switch {
	case err == nil:
		s.MarkTrue(infrav1.AddressReservedCondition, infrav1.ReadyReason,
			fmt.Sprintf("%s is reserved for %s on network %s", ip, s.MAC(), network.Name))
		return nil
	case errors.Is(err, virt.ErrNoDHCP):
		s.MarkTrue(infrav1.AddressReservedCondition, infrav1.ReservationNotSupportedReason,
			fmt.Sprintf("libvirt serves no DHCP on network %s: the guest agent reports the address", network.Name))
		return nil
	case virt.IsNotFound(err):
		s.MarkFalse(infrav1.AddressReservedCondition, infrav1.WaitingForNetworkReason, "Network %s does not exist", network.Name)
		return services.Requeue(waitForNetwork, "network missing")
	case errors.As(err, &conflict):
		s.MarkFalse(infrav1.AddressReservedCondition, infrav1.AddressConflictReason, "%s", conflict.Error())
		if !conflict.Until.IsZero() {
			return services.Requeue(time.Until(conflict.Until)+time.Second, "address leased to another MAC")
		}
		return err
	default:
		s.MarkFalse(infrav1.AddressReservedCondition, infrav1.LibvirtErrorReason, "Reserving an address: %v", err)
		return err
	}
}

// ensureMAC chooses the NIC's MAC once: the first of the UID-derived
// candidates that no other host entry of the network uses. It is patched
// onto the LibvirtMachine, together with the pool and network, before the
// reservation is made, so a crash never leaves an entry we cannot name.
func (svc *Service) ensureMAC(ctx context.Context, network scope.NetworkRef) error {
	s := svc.scope
	if s.MAC() != "" {
		return nil
	}
	var taken []virt.Reservation
	if network.Name != "" {
		var err error
		taken, err = s.LibvirtHost().Reservations(ctx, network.Name)
		switch {
		case errors.Is(err, virt.ErrNoDHCP):
		case virt.IsNotFound(err):
			s.MarkFalse(infrav1.AddressReservedCondition, infrav1.WaitingForNetworkReason, "Network %s does not exist", network.Name)
			return services.Requeue(waitForNetwork, "network missing")
		case err != nil:
			s.MarkFalse(infrav1.AddressReservedCondition, infrav1.LibvirtErrorReason, "Listing reservations: %v", err)
			return err
		}
	}
	mac := ""
	for _, c := range scope.MACCandidates(s.MACSeed(), macCandidates) {
		if !reserved(taken, c.String()) {
			mac = c.String()
			break
		}
	}
	if mac == "" {
		s.MarkFalse(infrav1.AddressReservedCondition, infrav1.AddressConflictReason,
			"All %d MACs derived for this machine are reserved on network %s", macCandidates, network.Name)
		return fmt.Errorf("no free MAC among %d candidates", macCandidates)
	}
	s.SetMAC(mac)
	s.RecordPlacement()
	return s.PatchObject(ctx)
}

func reserved(entries []virt.Reservation, mac string) bool {
	for _, e := range entries {
		if netalloc.SameMAC(e.MAC, mac) {
			return true
		}
	}
	return false
}

// Delete removes the machine's host entry. A machine whose MAC was never
// recorded made no reservation.
func (svc *Service) Delete(ctx context.Context) error {
	s := svc.scope
	network := s.Network()
	if s.MAC() == "" || network.Name == "" {
		return nil
	}
	if err := s.LibvirtHost().ReleaseAddress(ctx, network.Name, s.MAC()); err != nil && !virt.IsNotFound(err) {
		return fmt.Errorf("releasing the address of %s: %w", s.MAC(), err)
	}
	return nil
}
