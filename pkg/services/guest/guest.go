// Package guest reads what only the running guest knows: its addresses
// (DHCP leases, or the guest agent on bridges) and whether cloud-init
// finished the bootstrap (the sentinel file, read through the guest agent).
package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	// SentinelPath is written by Cluster API bootstrap providers when the
	// bootstrap succeeded.
	SentinelPath = "/run/cluster-api/bootstrap-success.complete"
	// cloudInitResultPath is written by cloud-init when it has finished;
	// without the sentinel by then, the bootstrap failed.
	cloudInitResultPath = "/run/cloud-init/result.json"
)

// Rechecks where no event exists. A lease event and the guest agent's
// connect event normally come first; these only cover lost events.
const (
	recheckLease = time.Minute
	recheckAgent = 15 * time.Second
	minBackoff   = 10 * time.Second
	maxBackoff   = time.Minute
)

// LeaseWatcher asks the host to publish an event once mac has a lease on
// network; the reconcile it triggers then finds the address.
type LeaseWatcher interface {
	WatchLease(network, mac string)
}

// Service owns the AddressAssigned and BootstrapSucceeded conditions. It
// creates nothing, so it has no Delete.
type Service struct {
	scope  *scope.MachineScope
	leases LeaseWatcher
}

// New returns the guest service of s; leases may be nil.
func New(s *scope.MachineScope, leases LeaseWatcher) *Service {
	return &Service{scope: s, leases: leases}
}

// ReconcileAddresses sets status.addresses from the guest's lease (or the
// guest agent on networks without libvirt DHCP). A reservation alone does
// not count: the guest must actually hold the address.
func (svc *Service) ReconcileAddresses(ctx context.Context) error {
	s := svc.scope
	network := s.Network()
	addrs, err := s.Host.Addresses(ctx, virt.AddressQuery{Domain: s.DomainName(), Network: network.Name, MAC: s.MAC()})
	switch {
	case err == nil:
	case network.Name == "" || errors.Is(err, virt.ErrAgentUnavailable):
		if s.IsProvisioned() {
			return nil // keep the addresses last seen
		}
		s.MarkFalse(infrav1.AddressAssignedCondition, infrav1.WaitingForAddressReason, "Asking the guest agent: %v", err)
		return services.Requeue(recheckAgent, "guest agent not answering")
	default:
		s.MarkFalse(infrav1.AddressAssignedCondition, infrav1.LibvirtErrorReason, "Reading addresses: %v", err)
		return err
	}
	var ips []string
	for _, a := range addrs {
		if a.Source != virt.AddressSourceReservation && a.IP.IsValid() {
			ips = append(ips, a.IP.String())
		}
	}
	if len(ips) == 0 {
		if s.IsProvisioned() {
			return nil
		}
		s.MarkFalse(infrav1.AddressAssignedCondition, infrav1.WaitingForAddressReason, "No DHCP lease for %s yet", s.MAC())
		if network.Name != "" && svc.leases != nil {
			svc.leases.WatchLease(network.Name, s.MAC())
		}
		return services.Requeue(recheckLease, "waiting for a lease")
	}
	s.SetAddresses(ips)
	s.MarkTrue(infrav1.AddressAssignedCondition, infrav1.ReadyReason, "")
	return nil
}

// ReconcileBootstrap checks the sentinel until it is seen once.
func (svc *Service) ReconcileBootstrap(ctx context.Context) error {
	s := svc.scope
	if conditions.IsTrue(s.LibvirtMachine, infrav1.BootstrapSucceededCondition) {
		return nil
	}
	_, err := s.Host.GuestReadFile(ctx, s.DomainName(), SentinelPath)
	switch {
	case err == nil:
		s.MarkTrue(infrav1.BootstrapSucceededCondition, infrav1.ReadyReason, "")
		return nil
	case virt.IsNotFound(err):
		if errs, done := svc.cloudInitResult(ctx); done {
			s.MarkFalse(infrav1.BootstrapSucceededCondition, infrav1.BootstrapFailedReason,
				"cloud-init finished (%d errors) without writing %s; see /var/log/cloud-init-output.log in the guest", errs, SentinelPath)
			return services.Requeue(maxBackoff, "bootstrap failed")
		}
		s.MarkFalse(infrav1.BootstrapSucceededCondition, infrav1.WaitingForBootstrapReason, "cloud-init has not written %s yet", SentinelPath)
	default:
		s.MarkFalse(infrav1.BootstrapSucceededCondition, infrav1.GuestAgentUnavailableReason, "Reading %s: %v", SentinelPath, err)
	}
	return services.Requeue(svc.backoff(), "bootstrap not finished")
}

// cloudInitResult reads cloud-init's result file: done tells whether it
// exists, errs how many errors it lists. Its error texts are not copied
// anywhere: they may quote bootstrap data.
func (svc *Service) cloudInitResult(ctx context.Context) (errs int, done bool) {
	data, err := svc.scope.Host.GuestReadFile(ctx, svc.scope.DomainName(), cloudInitResultPath)
	if err != nil {
		return 0, false
	}
	var result struct {
		V1 struct {
			Errors []json.RawMessage `json:"errors"`
		} `json:"v1"`
	}
	if json.Unmarshal(data, &result) != nil {
		return 0, true
	}
	return len(result.V1.Errors), true
}

// backoff grows with the time since the guest got its address (cloud-init
// runs after that): polls are frequent when the sentinel is due soon and
// rare when something is slow.
func (svc *Service) backoff() time.Duration {
	since := time.Duration(0)
	if t := conditions.GetLastTransitionTime(svc.scope.LibvirtMachine, infrav1.AddressAssignedCondition); t != nil {
		since = time.Since(t.Time)
	}
	return min(max(since/4, minBackoff), maxBackoff)
}

// String names the service in logs.
func (svc *Service) String() string { return fmt.Sprintf("guest(%s)", svc.scope.DomainName()) }
