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
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Service chooses or adopts the identity; it reports only its failures,
// on the condition of its plan step.
type Service struct {
	vm   *scope.VM
	host virt.DomainHost
	// found is the VM's domain as this reconcile found it in libvirt;
	// nil when it did not look or found none of this VM's.
	found *virt.DomainInfo
}

var _ services.Service = (*Service)(nil)

// New returns the identity step of vm.
func New(vm *scope.VM, host virt.DomainHost) *Service { return &Service{vm: vm, host: host} }

func (*Service) Name() string { return "identity" }

// DomainDefined tells whether the VM's domain exists in libvirt: this
// reconcile found it, or the status holds the state libvirt reported.
// The steps after this one ask it.
func (svc *Service) DomainDefined() bool { return svc.found != nil || svc.vm.State != "" }

// Found tells whether this reconcile found the VM's domain in libvirt.
func (svc *Service) Found() bool { return svc.found != nil }

// Domain is the VM's domain as this reconcile found it, which the domain
// step then need not read again; nil when it did not look or found none
// of this VM's.
func (svc *Service) Domain() *virt.DomainInfo { return svc.found }

// Reconcile costs nothing once UUID and MAC are known and the status has
// seen the domain, unless the VM is disposable (then whether its domain
// still exists decides whether its volumes are ensured). Otherwise it looks the domain up by its name: one that the ownership metadata says is this
// VM's lends its UUID and MAC (a moved or restored object, or one whose
// status was lost); without one, a new random UUID is chosen, and the
// address step chooses the MAC.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.found = nil
	if vm.UUID != "" && vm.MAC != "" && vm.State != "" && !vm.Disposable {
		return services.Result{}, nil
	}
	info, err := svc.host.DomainInfo(ctx, vm.Domain)
	if err != nil && !virt.IsNotFound(err) {
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Looking up domain %s: %v", vm.Domain, err)
	}
	// No domain, or one that is not this VM's (the domain step reports
	// that; a UUID of our own keeps it apart): choose a UUID, once.
	if err != nil || !info.Owner.IsObject(vm.Owner) {
		if vm.UUID == "" {
			vm.UUID = uuid.NewString()
		}
		return services.Result{}, nil
	}
	if vm.UUID == "" {
		vm.UUID = strings.ToLower(info.UUID)
	}
	if !strings.EqualFold(info.UUID, vm.UUID) {
		return services.Result{}, nil // replaced: the domain step says so
	}
	if vm.MAC == "" && info.MAC != "" {
		vm.MAC = info.MAC
	}
	svc.found = &info
	return services.Result{}, nil
}

// Delete does nothing: the identity is the domain's, which the domain step
// removes.
func (*Service) Delete(context.Context) error { return nil }
