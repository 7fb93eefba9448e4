package scope

import (
	"context"
	"strings"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// LoadBalancerScope is the HAProxy VM of a cluster as the machine services
// (address, disk, seed, domain) see it. The VM's steps have no conditions
// of their own: the load balancer's plan reports them on LoadBalancerReady.
type LoadBalancerScope struct {
	c *ClusterScope
	vmVolumes
	// domainFound is set when this reconcile found the VM's domain.
	domainFound bool
}

// Annotations of the LibvirtCluster that record its HAProxy VM's identity,
// chosen once: clusterctl move and restores keep annotations, not status.
const (
	LoadBalancerUUIDAnnotation = "libvirt.infrastructure.cluster.x-k8s.io/loadbalancer-uuid"
	LoadBalancerMACAnnotation  = "libvirt.infrastructure.cluster.x-k8s.io/loadbalancer-mac"
)

// LoadBalancer returns the scope of the cluster's HAProxy VM.
func (s *ClusterScope) LoadBalancer() *LoadBalancerScope { return &LoadBalancerScope{c: s} }

// LoadBalancerStatus returns status.loadBalancer, creating it.
func (s *ClusterScope) LoadBalancerStatus() *infrav1.LoadBalancerStatus {
	st := &s.LibvirtCluster.Status
	if st.LoadBalancer == nil {
		st.LoadBalancer = &infrav1.LoadBalancerStatus{}
	}
	return st.LoadBalancer
}

// Cluster is the scope of the cluster the VM serves.
func (s *LoadBalancerScope) Cluster() *ClusterScope { return s.c }

// DomainName is the VM's domain (see LoadBalancerDomainName).
func (s *LoadBalancerScope) DomainName() string {
	return naming.LoadBalancerDomainName(s.c.Namespace(), s.c.Name())
}

// DomainUUID is the VM's UUID, chosen once and recorded in an annotation;
// "" until the identity step chose or adopted it.
func (s *LoadBalancerScope) DomainUUID() string {
	return s.c.LibvirtCluster.Annotations[LoadBalancerUUIDAnnotation]
}

// SetDomainUUID records the VM's UUID (once).
func (s *LoadBalancerScope) SetDomainUUID(uuid string) {
	annotateOnce(s.c.LibvirtCluster, LoadBalancerUUIDAnnotation, strings.ToLower(uuid))
}

// DomainSeen tells whether the status recorded the VM's state.
func (s *LoadBalancerScope) DomainSeen() bool {
	lb := s.c.LibvirtCluster.Status.LoadBalancer
	return lb != nil && lb.Domain != nil && lb.Domain.State != ""
}

// SetDomainFound records that the VM's domain exists.
func (s *LoadBalancerScope) SetDomainFound() { s.domainFound = true }

// OverlayVolume is the name of the VM's root disk volume.
func (s *LoadBalancerScope) OverlayVolume() string { return naming.OverlayVolumeName(s.DomainName()) }

// SeedVolume is the name of the VM's NoCloud seed volume.
func (s *LoadBalancerScope) SeedVolume() string { return naming.SeedVolumeName(s.DomainName()) }

// ConsoleLogVolume is the name of the VM's console log volume.
func (s *LoadBalancerScope) ConsoleLogVolume() string {
	return naming.ConsoleLogVolumeName(s.DomainName())
}

// Hostname is "<cluster>-lb".
func (s *LoadBalancerScope) Hostname() string {
	name := s.c.ClusterName()
	if name == "" {
		name = s.c.Name()
	}
	return naming.LoadBalancerHostname(name)
}

// Owner is the LibvirtCluster.
func (s *LoadBalancerScope) Owner() virt.Owner { return s.c.Owner() }

// Pool is the cluster's pool (see ClusterScope.Pool).
func (s *LoadBalancerScope) Pool() virt.PoolSpec { return s.c.Pool() }

// Network is the cluster's network from status.network; zero until known.
func (s *LoadBalancerScope) Network() NetworkRef {
	n := s.c.LibvirtCluster.Status.Network
	switch {
	case n == nil:
		return NetworkRef{}
	case n.Name != "":
		return NetworkRef{Name: n.Name}
	default:
		return NetworkRef{Bridge: n.Bridge}
	}
}

// Hardware is spec.loadBalancer's hardware with defaults applied.
func (s *LoadBalancerScope) Hardware() infrav1.VirtualHardware {
	return defaultHardware(s.c.LibvirtCluster.Spec.LoadBalancer.VirtualHardware,
		infrav1.DefaultLoadBalancerCPUs, infrav1.DefaultLoadBalancerMemoryMiB)
}

// DiskSizeBytes is zero: the root disk has the base image's size.
func (s *LoadBalancerScope) DiskSizeBytes() uint64 { return 0 }

// Image is spec.loadBalancer.image, else DefaultLoadBalancerImageVolume in
// the cluster's pool.
func (s *LoadBalancerScope) Image() infrav1.ImageSource {
	if img := s.c.LibvirtCluster.Spec.LoadBalancer.Image; img != nil {
		return *img
	}
	return infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: infrav1.DefaultLoadBalancerImageVolume}}
}

// domainStatus returns status.loadBalancer.domain with the derived
// identity filled in.
func (s *LoadBalancerScope) domainStatus() *infrav1.DomainStatus {
	st := s.c.LoadBalancerStatus()
	if st.Domain == nil {
		st.Domain = &infrav1.DomainStatus{}
	}
	st.Domain.Name = s.DomainName()
	st.Domain.UUID = s.DomainUUID()
	st.Domain.Host = s.c.HostName
	return st.Domain
}

// MAC is the NIC's MAC once chosen, else "".
func (s *LoadBalancerScope) MAC() netalloc.MAC {
	if lb := s.c.LibvirtCluster.Status.LoadBalancer; lb != nil && lb.Domain != nil && lb.Domain.MAC != "" {
		return netalloc.CanonicalMAC(lb.Domain.MAC)
	}
	return netalloc.CanonicalMAC(s.c.LibvirtCluster.Annotations[LoadBalancerMACAnnotation])
}

// SetMAC records the chosen MAC in status.loadBalancer.domain and (once)
// in its annotation.
func (s *LoadBalancerScope) SetMAC(mac netalloc.MAC) {
	s.domainStatus().MAC = mac.String()
	annotateOnce(s.c.LibvirtCluster, LoadBalancerMACAnnotation, mac.String())
}

// RecordPlacement records the pool of the VM's volumes (once), so that
// deletion finds them after spec.storagePool changed. The network is
// status.network, which is kept until deletion.
func (s *LoadBalancerScope) RecordPlacement() {
	lc := s.c.LibvirtCluster
	if lc.Annotations == nil {
		lc.Annotations = map[string]string{}
	}
	if lc.Annotations[PoolAnnotation] == "" {
		lc.Annotations[PoolAnnotation] = s.Pool().Name
	}
}

// PatchObject persists the LibvirtCluster.
func (s *LoadBalancerScope) PatchObject(ctx context.Context) error { return s.c.PatchObject(ctx) }

// SetDomainState records libvirt's state of the VM.
func (s *LoadBalancerScope) SetDomainState(state string) { s.domainStatus().State = state }

// IsProvisioned is false: the HAProxy VM holds no state of its own (the
// controller pushes its configuration), so a vanished or stopped VM is
// recreated or restarted rather than given up on.
func (s *LoadBalancerScope) IsProvisioned() bool { return false }

// DomainDefined tells whether the VM's domain exists in libvirt: this
// reconcile found it, or the status recorded the state libvirt reported.
func (s *LoadBalancerScope) DomainDefined() bool { return s.domainFound || s.DomainSeen() }

// Event records an event on the LibvirtCluster.
func (s *LoadBalancerScope) Event(eventType, reason, message string) {
	s.c.Event(eventType, reason, message)
}
