package scope

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// ClusterConditions are the conditions of the cluster's steps, in order;
// Ready summarises them.
var ClusterConditions = []string{
	infrav1.StoragePoolReadyCondition,
	infrav1.NetworkReadyCondition,
	infrav1.LoadBalancerReadyCondition,
}

// ClusterScopeParams are the inputs of NewClusterScope. Cluster may be nil
// while the LibvirtCluster is deleted.
type ClusterScopeParams struct {
	Client         client.Client
	Cluster        *clusterv1.Cluster
	LibvirtCluster *infrav1.LibvirtCluster
	// Host is the libvirt host of the cluster (one host today).
	Host virt.Host
	// HostName names Host: the default failure domain and status.loadBalancer.domain.host.
	HostName string
	Recorder record.EventRecorder
}

// ClusterScope is one reconcile of one LibvirtCluster.
type ClusterScope struct {
	Client         client.Client
	Cluster        *clusterv1.Cluster
	LibvirtCluster *infrav1.LibvirtCluster
	Host           virt.Host
	HostName       string

	objectScope
	// loadBalancer is the HAProxy VM once LoadBalancerVM built it; every
	// patch writes it back.
	loadBalancer *VM
}

// NewClusterScope builds the scope and snapshots the LibvirtCluster for
// the patch Close sends.
func NewClusterScope(p ClusterScopeParams) (*ClusterScope, error) {
	if p.Client == nil || p.LibvirtCluster == nil || p.Host == nil {
		return nil, errors.New("cluster scope needs a client, a LibvirtCluster and a host")
	}
	o, err := newObjectScope(p.Client, "LibvirtCluster", p.LibvirtCluster, p.Recorder, ClusterConditions)
	if err != nil {
		return nil, err
	}
	return &ClusterScope{
		Client: p.Client, Cluster: p.Cluster, LibvirtCluster: p.LibvirtCluster, Host: p.Host, HostName: p.HostName,
		objectScope: o,
	}, nil
}

// Name is the LibvirtCluster's name.
func (s *ClusterScope) Name() string { return s.LibvirtCluster.Name }

// Namespace is the LibvirtCluster's namespace.
func (s *ClusterScope) Namespace() string { return s.LibvirtCluster.Namespace }

// Object is the LibvirtCluster.
func (s *ClusterScope) Object() *infrav1.LibvirtCluster { return s.LibvirtCluster }

// ClusterName is the Cluster API cluster the LibvirtCluster belongs to.
func (s *ClusterScope) ClusterName() string {
	if s.Cluster != nil {
		return s.Cluster.Name
	}
	return s.LibvirtCluster.Labels[clusterv1.ClusterNameLabel]
}

// Owner is recorded in the metadata of the cluster's network and HAProxy
// VM; libvirt events carry it back.
func (s *ClusterScope) Owner() virt.Owner {
	return virt.Owner{
		Kind: "LibvirtCluster", Namespace: s.Namespace(), Name: s.Name(),
		UID: string(s.LibvirtCluster.UID), Cluster: s.ClusterName(),
	}
}

// NetworkSpec is spec.network: the network or bridge the user names, or
// the CIDR of the one the provider creates.
func (s *ClusterScope) NetworkSpec() infrav1.ClusterNetwork { return s.LibvirtCluster.Spec.Network }

// NetworkName is the NAT network the provider creates for the cluster
// (see naming.ClusterNetworkName).
func (s *ClusterScope) NetworkName() string {
	return naming.ClusterNetworkName(s.Namespace(), s.Name())
}

// OwnsNetworkName tells whether a network named NetworkName is the
// provider's to delete: unless the user named it in spec.network, it can
// only have been created for this cluster (the name derives from the
// LibvirtCluster's namespace and name), even if spec.network changed since.
func (s *ClusterScope) OwnsNetworkName() bool {
	return s.LibvirtCluster.Spec.Network.Name != s.NetworkName()
}

// SpecPool is the storage pool spec.storagePool asks for, defaults applied.
func (s *ClusterScope) SpecPool() virt.PoolSpec { return ClusterPool(s.LibvirtCluster) }

// Pool is the pool of the HAProxy VM's volumes: the one recorded once they
// were created, else SpecPool.
func (s *ClusterScope) Pool() virt.PoolSpec {
	return recordedPool(s.SpecPool(), s.LibvirtCluster.Annotations)
}

// PoolEnsuredMessage is StoragePoolReady's message once spec was ensured.
func PoolEnsuredMessage(spec virt.PoolSpec) string {
	return fmt.Sprintf("Pool %s at %s", spec.Name, spec.Path)
}

// PoolEnsured tells whether spec was ensured already (status.storagePool).
func (s *ClusterScope) PoolEnsured(spec virt.PoolSpec) bool {
	st := s.LibvirtCluster.Status.StoragePool
	return st != nil && st.Name == spec.Name && st.Path == spec.Path
}

// SetPoolEnsured records that spec was ensured (status.storagePool).
func (s *ClusterScope) SetPoolEnsured(spec virt.PoolSpec) {
	s.LibvirtCluster.Status.StoragePool = &infrav1.StoragePoolStatus{Name: spec.Name, Path: spec.Path}
}

// SetNetwork records the network the cluster's machines join.
func (s *ClusterScope) SetNetwork(info virt.NetworkInfo) {
	st := &infrav1.NetworkStatus{Name: info.Name, Bridge: info.Bridge, Managed: info.Managed}
	if info.CIDR.IsValid() {
		st.CIDR = info.CIDR.String()
	}
	s.LibvirtCluster.Status.Network = st
}

// LoadBalancerEnabled tells whether the provider runs the HAProxy VM.
func (s *ClusterScope) LoadBalancerEnabled() bool {
	return s.LibvirtCluster.Spec.LoadBalancer.Type != infrav1.LoadBalancerNone
}

// EndpointPort is the control-plane endpoint's port: the one given in
// spec.controlPlaneEndpoint, else DefaultAPIServerPort.
func (s *ClusterScope) EndpointPort() int32 {
	if p := s.LibvirtCluster.Spec.ControlPlaneEndpoint.Port; p != 0 {
		return p
	}
	return infrav1.DefaultAPIServerPort
}

// BackendPort is the port the API servers listen on in the control-plane
// machines: the Cluster's clusterNetwork.apiServerPort, else 6443.
func (s *ClusterScope) BackendPort() int32 {
	if s.Cluster != nil && s.Cluster.Spec.ClusterNetwork.APIServerPort != 0 {
		return s.Cluster.Spec.ClusterNetwork.APIServerPort
	}
	return infrav1.DefaultAPIServerPort
}

// SetFailureDomains publishes spec.failureDomains, or, when there are
// none, one failure domain named after the libvirt host that accepts
// control-plane machines.
func (s *ClusterScope) SetFailureDomains() {
	spec := s.LibvirtCluster.Spec.FailureDomains
	if len(spec) == 0 {
		name := s.HostName
		if name == "" {
			name = "localhost"
		}
		s.LibvirtCluster.Status.FailureDomains = []clusterv1.FailureDomain{{Name: name, ControlPlane: ptr.To(true)}}
		return
	}
	out := make([]clusterv1.FailureDomain, 0, len(spec))
	for _, fd := range spec {
		out = append(out, clusterv1.FailureDomain{Name: fd.Name, ControlPlane: fd.ControlPlane, Attributes: fd.Attributes})
	}
	s.LibvirtCluster.Status.FailureDomains = out
}

// IsProvisioned tells whether the infrastructure was ever reported provisioned.
func (s *ClusterScope) IsProvisioned() bool {
	return s.LibvirtCluster.Status.Initialization.IsProvisioned()
}

// SetProvisioned reports the infrastructure provisioned, in both contract
// forms; it is never reset.
func (s *ClusterScope) SetProvisioned() {
	if !s.IsProvisioned() {
		s.Event(corev1.EventTypeNormal, "Provisioned", "Cluster infrastructure is provisioned")
	}
	s.LibvirtCluster.Status.Initialization.Provisioned = ptr.To(true)
	s.LibvirtCluster.Status.Ready = true
}
