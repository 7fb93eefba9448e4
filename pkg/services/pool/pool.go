// Package pool ensures the cluster's storage pool, which holds the base
// images, overlays and seeds of the cluster's machines and load balancer.
package pool

import (
	"context"
	"fmt"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Scope is what the service needs of the cluster whose pool it ensures.
type Scope interface {
	// SpecPool is the pool the cluster asks for; PoolEnsured tells
	// whether it was ensured already, SetPoolEnsured records that it was.
	SpecPool() virt.PoolSpec
	PoolEnsured(spec virt.PoolSpec) bool
	SetPoolEnsured(spec virt.PoolSpec)
}

// Service ensures the pool; its outcome is StoragePoolReady's.
type Service struct {
	scope Scope
	host  virt.StorageHost
}

var _ services.Service = (*Service)(nil)

// New returns the storage pool service of s.
func New(s Scope, host virt.StorageHost) *Service { return &Service{scope: s, host: host} }

func (*Service) Name() string { return "storage pool" }

// Reconcile defines, starts and autostarts the pool spec.storagePool asks
// for, once: after that the machines' disk steps ensure it again when they
// need it, and the cluster's reconciles stay clear of the pool's lock,
// which image imports hold for long (a changed spec ensures the new
// pool). A pool named without a path is used as it is.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	s := svc.scope
	spec := s.SpecPool()
	if spec.Path == "" {
		return services.Done(infrav1.ReadyReason, fmt.Sprintf("Using the existing pool %s", spec.Name)), nil
	}
	if s.PoolEnsured(spec) {
		return services.Result{}, nil
	}
	if err := svc.host.EnsurePool(ctx, spec); err != nil {
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, fmt.Errorf("ensuring storage pool %s: %w", spec.Name, err),
			"Ensuring pool %s at %s: %v", spec.Name, spec.Path, err)
	}
	s.SetPoolEnsured(spec)
	return services.Done(infrav1.ReadyReason, scope.PoolEnsuredMessage(spec)), nil
}

// Delete does nothing: pools are shared by clusters and hold base images.
func (svc *Service) Delete(context.Context) error { return nil }
