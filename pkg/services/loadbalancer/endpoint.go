package loadbalancer

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
)

// endpoint reserves the HAProxy VM's address before it first boots and
// publishes it as the control-plane endpoint at once.
type endpoint struct{ lb *Service }

// Name labels the step in logs.
func (endpoint) Name() string { return "address" }

// Reconcile reserves the address and publishes the endpoint.
func (e endpoint) Reconcile(ctx context.Context) (services.Result, error) {
	svc := e.lb
	s := svc.scope
	network := svc.vm.Network()
	switch {
	case network.IsZero():
		return services.Result{}, services.Fail(infrav1.WaitingForNetworkReason, services.Requeue(0, "no network"), "Waiting for the cluster network")
	case network.Bridge != "":
		return services.Result{}, unsupported("host bridge " + network.Bridge)
	}
	if _, err := svc.address.Reconcile(ctx); err != nil {
		return services.Result{}, onVM(svc.vm, err)
	}
	ip := svc.address.Reserved()
	if !ip.IsValid() {
		return services.Result{}, unsupported("network " + network.Name + ", whose DHCP libvirt does not serve,")
	}
	s.LoadBalancerStatus().Address = ip.String()
	ep := &s.LibvirtCluster.Spec.ControlPlaneEndpoint
	switch ep.Host {
	case "":
		ep.Host, ep.Port = ip.String(), s.EndpointPort()
		s.Event(corev1.EventTypeNormal, "ControlPlaneEndpointSet", fmt.Sprintf("Control-plane endpoint is %s:%d, the HAProxy VM's reserved address", ep.Host, ep.Port))
		// Published before the VM exists: Cluster API and the control
		// plane provider need it to generate certificates.
		return services.Result{}, s.PatchObject(ctx)
	case ip.String():
		return services.Result{}, nil
	default:
		return services.Result{}, services.Fail(infrav1.ControlPlaneEndpointConflictReason, services.Requeue(0, "endpoint conflict"),
			"spec.controlPlaneEndpoint.host is %s but the HAProxy VM's address is %s; clear it, or use loadBalancer.type None", ep.Host, ip)
	}
}

// Delete releases the VM's address reservation.
func (e endpoint) Delete(ctx context.Context) error {
	return haproxyVM{e.lb.address, e.lb.vm}.Delete(ctx)
}

func unsupported(what string) error {
	return services.Fail(infrav1.UnsupportedNetworkReason, services.Requeue(0, "unsupported network"),
		"The HAProxy VM cannot get a reserved address on %s; use loadBalancer.type None with your own endpoint", what)
}

// userEndpoint: with type None the user serves the endpoint, which must be
// set; the infrastructure is provisioned with the network.
type userEndpoint struct{ lb *Service }

// Name labels the step in logs.
func (userEndpoint) Name() string { return "user endpoint" }

// Reconcile checks that the endpoint is set and completes its port.
func (u userEndpoint) Reconcile(context.Context) (services.Result, error) {
	s := u.lb.scope
	ep := &s.LibvirtCluster.Spec.ControlPlaneEndpoint
	if ep.Host == "" {
		return services.Result{}, services.Fail(infrav1.ControlPlaneEndpointMissingReason, services.Requeue(0, "no control-plane endpoint"),
			"loadBalancer.type None: set spec.controlPlaneEndpoint to the endpoint you serve (e.g. a kube-vip address)")
	}
	ep.Port = s.EndpointPort()
	return services.Done(infrav1.LoadBalancerDisabledReason,
		fmt.Sprintf("The user serves %s", net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))))), nil
}

// Delete does nothing: the user's endpoint is not ours.
func (userEndpoint) Delete(context.Context) error { return nil }
