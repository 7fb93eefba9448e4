package scope

import (
	"context"
	"strings"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

// Annotations of the LibvirtCluster that record its HAProxy VM's identity,
// chosen once: clusterctl move and restores keep annotations, not status.
const (
	LoadBalancerUUIDAnnotation = "libvirt.infrastructure.cluster.x-k8s.io/loadbalancer-uuid"
	LoadBalancerMACAnnotation  = "libvirt.infrastructure.cluster.x-k8s.io/loadbalancer-mac"
)

// LoadBalancerVM builds the cluster's HAProxy VM from the LibvirtCluster
// as it stands (its network is status.network, which the network step of
// the same reconcile may just have set); from then on every patch of the
// LibvirtCluster writes it back (writeLoadBalancerVM). Its steps have no
// conditions of their own: the load balancer's plan reports them on
// LoadBalancerReady.
func (s *ClusterScope) LoadBalancerVM() *VM {
	lc := s.LibvirtCluster
	var st *infrav1.DomainStatus
	if lc.Status.LoadBalancer != nil {
		st = lc.Status.LoadBalancer.Domain
	}
	name := s.ClusterName()
	if name == "" {
		name = s.Name()
	}
	s.loadBalancer = &VM{
		Domain:   naming.LoadBalancerDomainName(s.Namespace(), s.Name()),
		UUID:     lc.Annotations[LoadBalancerUUIDAnnotation],
		MAC:      recordedMAC(st, lc.Annotations[LoadBalancerMACAnnotation]),
		Hostname: naming.LoadBalancerHostname(name),
		Owner:    s.Owner(),
		Host:     s.HostName,
		Pool:     s.Pool(),
		Network:  statusNetwork(lc),
		// A pool's address is the endpoint, and the VM's only address.
		AddressPools: loadBalancerPools(lc.Spec.LoadBalancer.AddressFromPool),
		Hardware: defaultHardware(lc.Spec.LoadBalancer.VirtualHardware,
			infrav1.DefaultLoadBalancerCPUs, infrav1.DefaultLoadBalancerMemoryMiB),
		Image: s.LoadBalancerImage(),
		// The root disk takes the image's size.
		DiskSizeBytes: 0,
		State:         recordedState(st),
		Disposable:    true,
		object:        vmObject{persist: func(ctx context.Context) error { return s.PatchObject(ctx) }, event: s.Event},
	}
	s.loadBalancer.Addressing = AddressingOf(s.loadBalancer.Network, s.loadBalancer.AddressPools)
	s.writeBack = s.writeLoadBalancerVM
	return s.loadBalancer
}

// writeLoadBalancerVM writes the HAProxy VM back to the LibvirtCluster:
// UUID and MAC into their annotations and the pool into its own (each
// once), status.loadBalancer.domain. The network is status.network, which
// is kept until deletion.
func (s *ClusterScope) writeLoadBalancerVM() {
	vm, lc := s.loadBalancer, s.LibvirtCluster
	if vm == nil {
		return
	}
	if vm.UUID != "" {
		annotateOnce(lc, LoadBalancerUUIDAnnotation, strings.ToLower(vm.UUID))
	}
	if vm.MAC != "" {
		annotateOnce(lc, LoadBalancerMACAnnotation, vm.MAC.String())
	}
	if vm.placementRecorded {
		annotateOnce(lc, PoolAnnotation, vm.Pool.Name)
	}
	var st *infrav1.DomainStatus
	if lc.Status.LoadBalancer != nil {
		st = lc.Status.LoadBalancer.Domain
	}
	if st = vm.domainStatus(st); st != nil {
		s.LoadBalancerStatus().Domain = st
	}
}

// LoadBalancerDeleted forgets the HAProxy VM and its status once its
// objects are deleted.
func (s *ClusterScope) LoadBalancerDeleted() {
	s.loadBalancer = nil
	s.LibvirtCluster.Status.LoadBalancer = nil
}

// LoadBalancerImage is spec.loadBalancer.image, else
// DefaultLoadBalancerImageVolume in the cluster's pool.
func (s *ClusterScope) LoadBalancerImage() infrav1.ImageSource {
	if img := s.LibvirtCluster.Spec.LoadBalancer.Image; img != nil {
		return *img
	}
	return infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: infrav1.DefaultLoadBalancerImageVolume}}
}

// LoadBalancerStatus returns status.loadBalancer, creating it.
func (s *ClusterScope) LoadBalancerStatus() *infrav1.LoadBalancerStatus {
	st := &s.LibvirtCluster.Status
	if st.LoadBalancer == nil {
		st.LoadBalancer = &infrav1.LoadBalancerStatus{}
	}
	return st.LoadBalancer
}

// statusNetwork is the network lc reports in status.network; zero until
// it does.
func statusNetwork(lc *infrav1.LibvirtCluster) NetworkRef {
	n := lc.Status.Network
	switch {
	case n == nil:
		return NetworkRef{}
	case n.Name != "":
		return NetworkRef{Name: n.Name}
	default:
		return NetworkRef{Bridge: n.Bridge}
	}
}

// loadBalancerPools is the HAProxy VM's address pool as a VM's list.
func loadBalancerPools(pool *infrav1.IPPoolReference) []infrav1.IPPoolReference {
	if pool == nil {
		return nil
	}
	return []infrav1.IPPoolReference{*pool}
}
