package loadbalancer

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
)

// Drain waits of a deleting control-plane machine.
const (
	// drainPoll is how often the machine controller looks whether the
	// cluster controller has drained the machine (it reacts to the
	// deletion within a reconcile; this only bounds the lag).
	drainPoll = 2 * time.Second
	// DefaultDrainTimeout bounds the wait: a load balancer that cannot be
	// reconfigured (its VM broken) must not block machine deletion forever.
	DefaultDrainTimeout = 3 * time.Minute
)

// drainable tells whether HAProxy runs a configuration of ours and accepted
// connections when last checked: only then can it drain a machine. A VM
// that broke since (its steps fail before the check) counts as serving
// until DefaultDrainTimeout.
func drainable(lb *infrav1.LoadBalancerStatus) bool {
	return lb != nil && lb.ConfigHash != "" && lb.NotServingSince == nil
}

// Deregisterer holds back the deletion of a control-plane machine's domain
// until HAProxy sends it no new connections. The LibvirtCluster controller
// does the draining (it watches Machines and LibvirtMachines, and sets a
// deleting machine's weight to 0); the Deregisterer only waits for
// status.loadBalancer.backends, which is written once HAProxy confirmed
// the configuration, to say so.
type Deregisterer struct {
	// Timeout bounds the wait from the LibvirtMachine's deletion; zero
	// means DefaultDrainTimeout.
	Timeout time.Duration
}

// DeregisterMachine returns nil once the machine is drained or no backend
// (any more), when there is nothing to drain to (it is the last API server
// taking connections), when the whole cluster is being deleted (Cluster
// API deletes the machines before the LibvirtCluster, and no client of the
// endpoint is left to spare), when the cluster has no HAProxy VM that
// serves, or when the wait timed out; otherwise a services.ConditionError
// for DomainReady that waits (a services.RequeueError).
func (d *Deregisterer) DeregisterMachine(_ context.Context, s *scope.MachineScope) error {
	lc := s.LibvirtCluster
	if (s.Cluster != nil && !s.Cluster.DeletionTimestamp.IsZero()) ||
		lc == nil || !lc.DeletionTimestamp.IsZero() || lc.Spec.LoadBalancer.Type == infrav1.LoadBalancerNone ||
		!drainable(lc.Status.LoadBalancer) {
		return nil
	}
	backends := lc.Status.LoadBalancer.Backends
	mine := -1
	address := InternalIP(s.LibvirtMachine)
	for i, b := range backends {
		if (s.Machine != nil && b.Machine == s.Machine.Name) || (address != "" && b.Address == address) {
			mine = i
		}
	}
	if mine < 0 || backends[mine].State == infrav1.BackendDraining {
		return nil
	}
	others := 0
	for i, b := range backends {
		if i != mine && b.State == infrav1.BackendActive {
			others++
		}
	}
	if others == 0 {
		return nil
	}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = DefaultDrainTimeout
	}
	if deleted := s.LibvirtMachine.DeletionTimestamp; deleted != nil && time.Since(deleted.Time) > timeout {
		s.Event(corev1.EventTypeWarning, "LoadBalancerDrainTimeout", fmt.Sprintf(
			"The load balancer still sends new connections to %s after %s; deleting the machine anyway", backends[mine].Machine, timeout))
		return nil
	}
	return services.Fail(infrav1.DeletingReason, services.Requeue(drainPoll, "waiting for the load balancer to drain the machine"),
		"Waiting for the load balancer to drain %s", backends[mine].Machine)
}
