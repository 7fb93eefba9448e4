package loadbalancer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// endpoint publishes the HAProxy VM's address, which the address step
// before it reserved (or the IPAM step claimed from a pool), as the
// control-plane endpoint before the VM first boots. On a host bridge,
// where no DHCP server of ours can reserve it, the endpoint is the user's
// (a free address of the LAN) and the VM holds it as a static address.
type endpoint struct {
	scope  *scope.ClusterScope
	vm     *scope.VM
	policy tenancy.Policy
	// reserved and claimed are the address and IPAM steps' results.
	reserved func() netip.Addr
	claimed  func() []cloudinit.StaticAddress
}

func (endpoint) Name() string { return "endpoint" }

// Reconcile publishes the endpoint.
func (e endpoint) Reconcile(ctx context.Context) (services.Result, error) {
	s := e.scope
	var ip netip.Addr
	switch e.vm.Addressing {
	case scope.AddressingPool:
		if claimed := e.claimed(); len(claimed) > 0 {
			ip = claimed[0].Prefix.Addr()
		}
	case scope.AddressingLAN:
		return e.static()
	default:
		ip = e.reserved()
	}
	if !ip.IsValid() {
		return services.Result{}, services.Fail(infrav1.UnsupportedNetworkReason, services.Requeue(0, "unsupported network"),
			"The HAProxy VM cannot get a reserved address on network %s, whose DHCP libvirt does not serve; use loadBalancer.type None with your own endpoint", e.vm.Network.Name)
	}
	s.LoadBalancerStatus().Address = ip.String()
	ep := &s.LibvirtCluster.Spec.ControlPlaneEndpoint
	switch ep.Host {
	case "":
		ep.Host, ep.Port = ip.String(), s.EndpointPort()
		s.Event(corev1.EventTypeNormal, "ControlPlaneEndpointSet", fmt.Sprintf("Control-plane endpoint is %s:%d, the HAProxy VM's address", ep.Host, ep.Port))
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

// static takes the user's endpoint as the HAProxy VM's static address on
// a host bridge.
func (e endpoint) static() (services.Result, error) {
	s := e.scope
	ep := &s.LibvirtCluster.Spec.ControlPlaneEndpoint
	if err := tenancy.CheckStaticAddress(e.policy.TrafficFilter); err != nil {
		return services.Result{}, services.Fail(infrav1.UnsupportedNetworkReason, services.Requeue(0, "static address filtered"), "%v", err)
	}
	ip, err := staticAddress(s.LibvirtCluster)
	if err != nil {
		return services.Result{}, services.Fail(infrav1.ControlPlaneEndpointMissingReason, services.Requeue(0, "no static endpoint"), "%v", err)
	}
	ep.Port = s.EndpointPort()
	s.LoadBalancerStatus().Address = ip.String()
	return services.Result{}, nil
}

// staticAddress is the address the HAProxy VM holds on a host bridge: the
// endpoint's host, which must be an IP address.
func staticAddress(lc *infrav1.LibvirtCluster) (netip.Addr, error) {
	host := lc.Spec.ControlPlaneEndpoint.Host
	if host == "" {
		return netip.Addr{}, fmt.Errorf("on host bridge %s the HAProxy VM serves spec.controlPlaneEndpoint.host as a static address: set it to a free address of the LAN, outside its DHCP range", lc.Spec.Network.Bridge)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("on host bridge %s the HAProxy VM serves spec.controlPlaneEndpoint.host as a static address: %q is not an IP address", lc.Spec.Network.Bridge, host)
	}
	return ip, nil
}

// networkConfig is the HAProxy VM's network-config: with an address from
// a pool (static, the IPAM step's), that address alone; on a host bridge,
// DHCP from the LAN plus the endpoint as a static address; on a libvirt
// network, none (DHCP hands it the reserved address).
func networkConfig(lc *infrav1.LibvirtCluster, vm *scope.VM, static []cloudinit.StaticAddress) ([]byte, error) {
	switch vm.Addressing {
	case scope.AddressingPool:
		return vm.StaticNetworkConfig(static)
	case scope.AddressingLAN:
		ip, err := staticAddress(lc)
		if err != nil {
			return nil, err
		}
		return cloudinit.DHCPWithStaticAddress{MAC: vm.MAC.String(), InterfaceName: scope.GuestInterface, Static: ip}.NetworkConfig()
	default:
		return nil, nil
	}
}

// Delete does nothing: the address step releases the reservation, and
// the endpoint stays in spec.
func (endpoint) Delete(context.Context) error { return nil }

// userEndpoint: with type None the user serves the endpoint, which must be
// set; the infrastructure is provisioned with the network.
type userEndpoint struct{ lb *Service }

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
