// Package guest reads what only the running guest knows: its addresses
// (DHCP leases, or the guest agent on bridges) and whether cloud-init
// finished the bootstrap (the sentinel file, read through the guest agent).
package guest

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
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
	// bootstrapPoll is how often the sentinel is looked for while the
	// bootstrap runs; failedBootstrapPoll how often a failed bootstrap is
	// looked at again, in case the guest is mended by hand.
	bootstrapPoll       = 15 * time.Second
	failedBootstrapPoll = time.Minute
)

// LeaseWatcher asks the host to publish an event once mac has a lease on
// network; the reconcile it triggers then finds the address.
type LeaseWatcher interface {
	WatchLease(host virt.NetworkHost, network string, mac netalloc.MAC)
}

// Addresses reads the guest's addresses; its outcome is AddressAssigned's.
// It creates nothing, so its Delete does nothing.
type Addresses struct {
	vm     *scope.VM
	host   virt.NetworkHost
	leases LeaseWatcher
}

var _ services.Service = (*Addresses)(nil)

// NewAddresses returns the address reader of vm; leases may be nil.
func NewAddresses(vm *scope.VM, host virt.NetworkHost, leases LeaseWatcher) *Addresses {
	return &Addresses{vm: vm, host: host, leases: leases}
}

func (*Addresses) Name() string { return "addresses" }

// Delete does nothing: reading addresses creates nothing.
func (*Addresses) Delete(context.Context) error { return nil }

// Reconcile sets status.addresses from the guest's lease (or the guest
// agent on networks without libvirt DHCP). A reservation alone does not
// count: the guest must actually hold the address.
func (svc *Addresses) Reconcile(ctx context.Context) (services.Result, error) {
	s := svc.vm
	// A guest with addresses from IPAM pools holds no lease: only its
	// agent knows them, as on a host bridge.
	leasing := ""
	if s.Addressing == scope.AddressingReserved {
		leasing = s.Network.Name
	}
	addrs, err := svc.host.Addresses(ctx, virt.AddressQuery{Domain: s.Domain, Network: leasing, MAC: s.MAC})
	switch {
	case err == nil:
	case leasing == "" || errors.Is(err, virt.ErrAgentUnavailable):
		if s.Provisioned {
			return services.Result{}, nil // keep the addresses last seen
		}
		return services.Result{}, services.Fail(infrav1.WaitingForAddressReason, services.Requeue(recheckAgent, "guest agent not answering"),
			"Asking the guest agent: %v", err)
	default:
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Reading addresses: %v", err)
	}
	var ips []string
	for _, a := range addrs {
		if a.Source != virt.AddressSourceReservation && a.IP.IsValid() {
			ips = append(ips, a.IP.String())
		}
	}
	if len(ips) == 0 {
		if s.Provisioned {
			return services.Result{}, nil
		}
		if leasing != "" && svc.leases != nil {
			svc.leases.WatchLease(svc.host, leasing, s.MAC)
		}
		if leasing == "" {
			return services.Result{}, services.Fail(infrav1.WaitingForAddressReason, services.Requeue(recheckAgent, "no address yet"),
				"The guest agent reports no address for %s yet", s.MAC)
		}
		return services.Result{}, services.Fail(infrav1.WaitingForAddressReason, services.Requeue(recheckLease, "waiting for a lease"),
			"No DHCP lease for %s yet", s.MAC)
	}
	s.Addresses = ips
	return services.Done(infrav1.ReadyReason, ""), nil
}

// Bootstrap reads whether the guest's bootstrap succeeded; its outcome is
// BootstrapSucceeded's. It creates nothing, so its Delete does nothing.
type Bootstrap struct {
	vm            *scope.VM
	host          virt.GuestHost
	succeededOnce SucceededOnce
	// succeeded is set when this reconcile found the bootstrap done.
	succeeded bool
}

// SucceededOnce tells whether the machine's bootstrap succeeded at some
// earlier boot, from what the host keeps (seed.Emptied): after a reboot of
// a guest whose seed had no sentinel vendor-data (an older release's) the
// sentinel is gone and cloud-init has finished without writing it again.
type SucceededOnce func(ctx context.Context) (bool, error)

var _ services.Service = (*Bootstrap)(nil)

// NewBootstrap returns the bootstrap check of vm; succeededOnce is asked
// when cloud-init finished without the sentinel.
func NewBootstrap(vm *scope.VM, host virt.GuestHost, succeededOnce SucceededOnce) *Bootstrap {
	return &Bootstrap{vm: vm, host: host, succeededOnce: succeededOnce}
}

func (*Bootstrap) Name() string { return "bootstrap" }

// Succeeded tells whether this reconcile found the bootstrap done (in the
// guest, or in the emptied seed), for the bootstrap data's removal.
func (svc *Bootstrap) Succeeded() bool { return svc.succeeded }

// Delete does nothing: checking the bootstrap creates nothing.
func (*Bootstrap) Delete(context.Context) error { return nil }

// Reconcile checks the sentinel until it is seen once.
func (svc *Bootstrap) Reconcile(ctx context.Context) (services.Result, error) {
	s := svc.vm
	svc.succeeded = false
	if s.BootstrapDataRemoved {
		return services.Result{}, nil
	}
	_, err := svc.host.GuestReadFile(ctx, s.Domain, SentinelPath)
	switch {
	case err == nil:
		return svc.done("")
	case virt.IsNotFound(err):
		if errs, done := svc.cloudInitResult(ctx); done {
			// cloud-init writes its result after the per-boot scripts, one
			// of which links /run/cluster-api to where the sentinel of an
			// earlier boot is kept (cloudinit.BootstrapSentinelVendorData):
			// read again, the sentinel is there by now if it exists.
			if _, err := svc.host.GuestReadFile(ctx, s.Domain, SentinelPath); err == nil {
				return svc.done("")
			}
			if once, err := svc.succeededOnce(ctx); err != nil {
				return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Reading the seed: %v", err)
			} else if once {
				return svc.done("The bootstrap succeeded at an earlier boot: the seed no longer holds the bootstrap data")
			}
			return services.Result{}, services.Fail(infrav1.BootstrapFailedReason, services.Requeue(failedBootstrapPoll, "bootstrap failed"),
				"cloud-init finished (%d errors) without writing %s: the bootstrap failed, or the guest went down before it ended and "+
					"cloud-init does not run it again; see /var/log/cloud-init-output.log in the guest", errs, SentinelPath)
		}
		return services.Result{}, services.Fail(infrav1.WaitingForBootstrapReason, services.Requeue(bootstrapPoll, "bootstrap not finished"),
			"cloud-init has not written %s yet", SentinelPath)
	default:
		return services.Result{}, services.Fail(infrav1.GuestAgentUnavailableReason, services.Requeue(bootstrapPoll, "bootstrap not finished"),
			"Reading %s: %v", SentinelPath, err)
	}
}

// cloudInitResult reads cloud-init's result file: done tells whether it
// exists, errs how many errors it lists. Its error texts are not copied
// anywhere: they may quote bootstrap data.
func (svc *Bootstrap) cloudInitResult(ctx context.Context) (errs int, done bool) {
	data, err := svc.host.GuestReadFile(ctx, svc.vm.Domain, cloudInitResultPath)
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

// done reports the bootstrap done, for the removal step after it.
func (svc *Bootstrap) done(message string) (services.Result, error) {
	svc.succeeded = true
	return services.Done(infrav1.ReadyReason, message), nil
}
