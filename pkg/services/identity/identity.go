// Package identity gives a VM its domain UUID and MAC once, or adopts the
// ones its domain already has. Neither derives from a Kubernetes UID:
// clusterctl move and a restore recreate objects with new UIDs and no
// status, and the VM they describe must be found again, not made twice.
package identity

import (
	"context"
	"strings"

	"github.com/google/uuid"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Scope is what the service needs of a VM: a machine or the load
// balancer's HAProxy VM.
type Scope interface {
	DomainName() string
	// Owner is who the domain's ownership metadata must name for the
	// domain to be this VM's (kind, namespace and name; not the UID).
	Owner() virt.Owner
	// DomainUUID is "" until chosen; SetDomainUUID records it where it
	// survives a move (a machine's spec.providerID).
	DomainUUID() string
	SetDomainUUID(uuid string)
	// MAC is "" until chosen; SetMAC records it.
	MAC() netalloc.MAC
	SetMAC(mac netalloc.MAC)
	// SetDomainFound says the domain exists, so the volumes it was defined
	// on are complete; DomainSeen tells whether the status recorded the
	// domain's state (it did not after a move or a restore).
	SetDomainFound()
	DomainSeen() bool
}

// Service chooses or adopts the identity; it reports no condition.
type Service struct {
	scope Scope
	host  virt.DomainHost
}

var _ services.Service = (*Service)(nil)

// New returns the identity step of s.
func New(s Scope, host virt.DomainHost) *Service { return &Service{scope: s, host: host} }

// Name labels the step in logs.
func (*Service) Name() string { return "identity" }

// Reconcile costs nothing once UUID and MAC are known and the status has
// seen the domain. Otherwise it looks the domain up by its name: one that the ownership metadata says is this
// VM's lends its UUID and MAC (a moved or restored object, or one whose
// status was lost); without one, a new random UUID is chosen, and the
// address step chooses the MAC.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	s := svc.scope
	if s.DomainUUID() != "" && s.MAC() != "" && s.DomainSeen() {
		return services.Result{}, nil
	}
	info, err := svc.host.DomainInfo(ctx, s.DomainName())
	if err != nil && !virt.IsNotFound(err) {
		return services.Result{}, services.FailOn(infrav1.DomainReadyCondition, infrav1.LibvirtErrorReason, err, "Looking up domain %s: %v", s.DomainName(), err)
	}
	// No domain, or one that is not this VM's (the domain step reports
	// that; a UUID of our own keeps it apart): choose a UUID, once.
	if err != nil || !info.Owner.IsObject(s.Owner()) {
		if s.DomainUUID() == "" {
			s.SetDomainUUID(uuid.NewString())
		}
		return services.Result{}, nil
	}
	if s.DomainUUID() == "" {
		s.SetDomainUUID(info.UUID)
	}
	if !strings.EqualFold(info.UUID, s.DomainUUID()) {
		return services.Result{}, nil // replaced: the domain step says so
	}
	if s.MAC() == "" && info.MAC != "" {
		s.SetMAC(info.MAC)
	}
	s.SetDomainFound()
	return services.Result{}, nil
}

// Delete does nothing: the identity is the domain's, which the domain step
// removes.
func (*Service) Delete(context.Context) error { return nil }
