// Package network gives a cluster its network: an existing libvirt network
// or host bridge the user names, or a NAT network the provider creates
// with a subnet that collides with nothing on the host.
package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// recheck is how often a problem the user fixes outside the provider (a
// missing network, a colliding route) is looked at again; nothing watches
// the host's routes or networks.
const recheck = time.Minute

// Scope is what the service needs of the cluster whose network it gives.
type Scope interface {
	// NetworkSpec is what the cluster asks for.
	NetworkSpec() infrav1.ClusterNetwork
	// NetworkName is the network the provider creates for the cluster,
	// OwnsNetworkName whether one of that name is the provider's to
	// delete, and Owner what its metadata names.
	NetworkName() string
	OwnsNetworkName() bool
	Owner() virt.Owner
	// SetNetwork records the network the cluster's machines join.
	SetNetwork(info virt.NetworkInfo)
}

// Service gives the cluster its network; its outcome is NetworkReady's.
type Service struct {
	scope Scope
	host  virt.NetworkHost
	// candidates are the subnets a network the cluster gives no CIDR may
	// get, those the operator allows (tenancy.Policy.NetworkCIDRs).
	candidates []netip.Prefix
}

var _ services.Service = (*Service)(nil)

// New returns the network service of s, whose network, when the provider
// chooses its subnet, gets one of candidates (nil: netalloc's defaults).
func New(s Scope, host virt.NetworkHost, candidates []netip.Prefix) *Service {
	return &Service{scope: s, host: host, candidates: candidates}
}

func (*Service) Name() string { return "network" }

// Reconcile uses or creates the network and records it in status.network.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	s := svc.scope
	spec := s.NetworkSpec()
	var (
		info virt.NetworkInfo
		err  error
		what string
	)
	switch {
	case spec.Name != "":
		what = "network " + spec.Name
		info, err = svc.host.UseNetwork(ctx, spec.Name)
	case spec.Bridge != "":
		what = "host bridge " + spec.Bridge
		info, err = svc.host.UseBridge(ctx, spec.Bridge)
	default:
		what = "network " + s.NetworkName()
		want := virt.NetworkSpec{Name: s.NetworkName(), Owner: s.Owner(), Candidates: svc.candidates}
		if spec.CIDR != "" {
			if want.CIDR, err = netip.ParsePrefix(spec.CIDR); err != nil {
				// The CRD validates the CIDR; this is a defence only.
				return services.Result{}, services.Fail(string(virt.ConflictInvalidSpec), services.Requeue(0, "invalid cidr"),
					"spec.network.cidr %q: %v", spec.CIDR, err)
			}
		}
		info, err = svc.host.EnsureNetwork(ctx, want)
	}
	if err != nil {
		return services.Result{}, fail(what, err)
	}
	s.SetNetwork(info)
	msg := what
	if info.CIDR.IsValid() {
		msg += " (" + info.CIDR.String() + ")"
	}
	if info.Bridge != "" && spec.Bridge == "" {
		msg += " on bridge " + info.Bridge
	}
	return services.Done(infrav1.ReadyReason, msg), nil
}

// fail reports err with the reason it calls for. A conflict's reason names
// what collided (e.g. SubnetConflict, with the route or network in the
// message).
func fail(what string, err error) error {
	var conflict *virt.NetworkConflictError
	switch {
	case errors.As(err, &conflict):
		return services.Fail(string(conflict.Reason), services.Requeue(recheck, "network conflict"), "%s", conflict.Error())
	case errors.Is(err, virt.ErrNetworkInactive):
		return services.Fail(infrav1.NetworkInactiveReason, services.Requeue(recheck, "network inactive"),
			"%s exists but is not active; the provider does not start networks it does not own", what)
	case virt.IsNotFound(err):
		return services.Fail(infrav1.NetworkNotFoundReason, services.Requeue(recheck, "network missing"), "%s does not exist", what)
	default:
		return services.Fail(infrav1.LibvirtErrorReason, fmt.Errorf("%s: %w", what, err), "%s: %v", what, err)
	}
}

// Delete removes the NAT network the provider created for the cluster, if
// any, once no domain uses it. Networks the user named are never touched;
// one that carries no ownership metadata is not ours either.
func (svc *Service) Delete(ctx context.Context) error {
	s := svc.scope
	if !s.OwnsNetworkName() {
		return nil
	}
	err := svc.host.DeleteNetwork(ctx, s.NetworkName())
	var inUse *virt.NetworkInUseError
	switch {
	case err == nil, errors.Is(err, virt.ErrNetworkNotOwned):
		return nil
	case errors.As(err, &inUse):
		return services.Fail(infrav1.NetworkInUseReason, services.Requeue(30*time.Second, "network in use"), "%v", inUse)
	default:
		return fmt.Errorf("deleting network %s: %w", s.NetworkName(), err)
	}
}
