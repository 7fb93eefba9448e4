// Package pool ensures the cluster's storage pool, which holds the base
// images, overlays and seeds of the cluster's machines and load balancer.
package pool

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

// Service owns the StoragePoolReady condition.
type Service struct{ scope *scope.ClusterScope }

// New returns the storage pool service of s.
func New(s *scope.ClusterScope) *Service { return &Service{scope: s} }

// Reconcile defines, starts and autostarts the pool spec.storagePool asks
// for, once: after that the machines' disk steps ensure it again when they
// need it, and the cluster's reconciles stay clear of the pool's lock,
// which image imports hold for long (a changed spec ensures the new pool). A pool named without a path is used
// as it is.
func (svc *Service) Reconcile(ctx context.Context) error {
	s := svc.scope
	spec := s.SpecPool()
	if spec.Path == "" {
		s.MarkTrue(infrav1.StoragePoolReadyCondition, infrav1.ReadyReason, fmt.Sprintf("Using the existing pool %s", spec.Name))
		return nil
	}
	done := fmt.Sprintf("Pool %s at %s", spec.Name, spec.Path)
	if c := conditions.Get(s.LibvirtCluster, infrav1.StoragePoolReadyCondition); c != nil && c.Status == metav1.ConditionTrue && c.Message == done {
		return nil
	}
	if err := s.Host.EnsurePool(ctx, spec); err != nil {
		s.MarkFalse(infrav1.StoragePoolReadyCondition, infrav1.LibvirtErrorReason, "Ensuring pool %s at %s: %v", spec.Name, spec.Path, err)
		return fmt.Errorf("ensuring storage pool %s: %w", spec.Name, err)
	}
	s.MarkTrue(infrav1.StoragePoolReadyCondition, infrav1.ReadyReason, done)
	return nil
}

// Delete does nothing: pools are shared by clusters and hold base images.
func (svc *Service) Delete(context.Context) error { return nil }
