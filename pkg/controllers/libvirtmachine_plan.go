package controllers

import (
	"context"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/address"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/references"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
)

// plan is the machine's services in the order they create things, each
// with the condition its outcome sets; reconcile runs it forward, delete
// backward. Once the machine is provisioned, the reservation, root disk
// and seed (the Setup steps) belong to the running domain: ensuring them
// again would cost libvirt calls on every reconcile and recreate a
// vanished root disk as a blank one, so only the domain step and those
// after it watch over the machine from then on.
func (r *LibvirtMachineReconciler) plan(s *scope.MachineScope) services.Plan {
	return services.Plan{
		// The reference check names the condition of the step a refused
		// reference belongs to.
		{Service: references.NewMachine(s, r.Tenancy), Setup: true},
		{Service: address.New(s), Condition: infrav1.AddressReservedCondition, Setup: true},
		{Service: disk.New(s, r.Images), Condition: infrav1.DiskReadyCondition, Setup: true},
		{Service: seed.New(s), Condition: infrav1.BootstrapDataReadyCondition, Setup: true},
		{Service: domain.New(s, r.ShutdownTimeout), Condition: infrav1.DomainReadyCondition},
		{Service: guest.NewAddresses(s, r.events), Condition: infrav1.AddressAssignedCondition},
		{Service: loadBalancerMembership{s: s, lb: r.LoadBalancer}, Condition: infrav1.DomainReadyCondition},
		{Service: provisioned{s}},
		{Service: guest.NewBootstrap(s), Condition: infrav1.BootstrapSucceededCondition},
	}
}

// provisioned reports the machine provisioned once its domain runs and
// its guest holds an address; it is never reset.
type provisioned struct{ s *scope.MachineScope }

// Name labels the step in logs.
func (provisioned) Name() string { return "provisioned" }

// Reconcile reports the machine provisioned.
func (p provisioned) Reconcile(context.Context) (services.Result, error) {
	p.s.SetProvisioned()
	return services.Result{}, nil
}

// Delete does nothing: being provisioned is never reset.
func (provisioned) Delete(context.Context) error { return nil }

// loadBalancerMembership is a control-plane machine's place among the
// cluster's load balancer's backends. The LibvirtCluster controller adds
// it once the machine has an address; on delete the machine waits, before
// its domain is shut down, until the load balancer sends it no new
// connections.
type loadBalancerMembership struct {
	s  *scope.MachineScope
	lb LoadBalancerDeregisterer
}

// Name labels the step in logs.
func (loadBalancerMembership) Name() string { return "load balancer" }

// Reconcile does nothing: the LibvirtCluster controller adds the backend.
func (loadBalancerMembership) Reconcile(context.Context) (services.Result, error) {
	return services.Result{}, nil
}

// Delete waits for the load balancer to drain a control-plane machine.
func (m loadBalancerMembership) Delete(ctx context.Context) error {
	if m.lb == nil || !m.s.IsControlPlane() {
		return nil
	}
	return m.lb.DeregisterMachine(ctx, m.s)
}
