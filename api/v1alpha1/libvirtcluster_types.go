package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ClusterFinalizer lets the cluster controller remove the network and the
// load-balancer VM before the LibvirtCluster is gone. It is
// domain-qualified with a path, as the API server asks of finalizers.
const ClusterFinalizer = "infrastructure.cluster.x-k8s.io/libvirtcluster"

// LegacyClusterFinalizer is ClusterFinalizer's name in builds before
// 2026-11-28 (no path: the API server warned on every write). The
// controller replaces it on the objects that carry it, moved ones
// included, and honours it until then.
const LegacyClusterFinalizer = "libvirtcluster.infrastructure.cluster.x-k8s.io"

// LoadBalancerType chooses what serves the control-plane endpoint.
// +kubebuilder:validation:Enum=HAProxy;None
type LoadBalancerType string

const (
	// LoadBalancerHAProxy runs an HAProxy VM on the cluster network whose
	// reserved address becomes the control-plane endpoint (on a host
	// bridge it holds spec.controlPlaneEndpoint.host, a free IP address of
	// the LAN, as a static address); the default.
	LoadBalancerHAProxy LoadBalancerType = "HAProxy"
	// LoadBalancerNone leaves the endpoint to the user (kube-vip, an
	// external load balancer): spec.controlPlaneEndpoint must be set.
	LoadBalancerNone LoadBalancerType = "None"
)

// Default values the cluster controller applies to zero fields.
const (
	// DefaultAPIServerPort is the control-plane endpoint port when none is given.
	DefaultAPIServerPort = 6443
	// DefaultStoragePoolName is the pool holding base images and volumes when none is given.
	DefaultStoragePoolName = "capi-libvirt"
	// DefaultStoragePoolPath is the directory backing DefaultStoragePoolName.
	DefaultStoragePoolPath = "/var/lib/libvirt/capi-libvirt"
	// DefaultLoadBalancerCPUs is the vCPU count of the HAProxy VM.
	DefaultLoadBalancerCPUs = 1
	// DefaultLoadBalancerMemoryMiB is the memory of the HAProxy VM.
	DefaultLoadBalancerMemoryMiB = 512
	// DefaultLoadBalancerImageVolume is the HAProxy VM's base image when
	// spec.loadBalancer.image is empty: a volume of that name in the
	// cluster's storage pool (e.g. images/'s capl-debian-12-haproxy.qcow2,
	// uploaded under this name).
	DefaultLoadBalancerImageVolume = "capi-libvirt-haproxy.qcow2"
)

// LibvirtClusterSpec is the desired state of a LibvirtCluster.
// +kubebuilder:validation:XValidation:rule="!has(self.loadBalancer) || !has(self.loadBalancer.type) || self.loadBalancer.type != 'None' || !has(self.loadBalancer.image)",message="loadBalancer.image applies only to type HAProxy"
// +kubebuilder:validation:XValidation:rule="!has(self.loadBalancer) || !has(self.loadBalancer.type) || self.loadBalancer.type != 'None' || !has(self.loadBalancer.addressFromPool)",message="loadBalancer.addressFromPool applies only to type HAProxy"
// +kubebuilder:validation:XValidation:rule="!has(self.loadBalancer) || !has(self.loadBalancer.addressFromPool) || (has(self.network) && (has(self.network.bridge) || has(self.network.name)))",message="loadBalancer.addressFromPool needs network.bridge or network.name: the network the provider makes reserves the HAProxy VM's address in its own DHCP server"
type LibvirtClusterSpec struct {
	// controlPlaneEndpoint is where the cluster's API server is reached.
	// With the HAProxy load balancer the provider sets it to the VM's
	// reserved address (on a host bridge the user sets it to a free IP
	// address of the LAN, which the VM holds); with type None the user
	// sets it.
	// +optional
	ControlPlaneEndpoint clusterv1.APIEndpoint `json:"controlPlaneEndpoint,omitempty,omitzero"`

	// network is where the cluster's machines are plugged. Empty means the
	// provider creates a NAT network with DHCP for this cluster.
	// +optional
	Network ClusterNetwork `json:"network,omitempty,omitzero"`

	// loadBalancer serves the control-plane endpoint.
	// +optional
	LoadBalancer LoadBalancer `json:"loadBalancer,omitempty,omitzero"`

	// storagePool holds the cluster's volumes: base images (shared by all
	// clusters using the pool), overlays and cloud-init seeds.
	// +optional
	StoragePool StoragePool `json:"storagePool,omitempty,omitzero"`

	// failureDomains the cluster's machines may be placed in. Each is a
	// libvirt host: the one its uri names, or the manager's --libvirt-uri
	// host when it names none. Empty means one failure domain named after
	// the manager's host. A cluster whose failure domains name more than
	// one host needs network.bridge: a NAT network lives on one host.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	FailureDomains []FailureDomainSpec `json:"failureDomains,omitempty"`
}

// ClusterNetwork is the network of a cluster: an existing libvirt network,
// an existing host bridge, or (when neither is set) a NAT network the
// provider creates, optionally with a given CIDR.
// +kubebuilder:validation:XValidation:rule="[has(self.name), has(self.bridge), has(self.cidr)].filter(x, x).size() <= 1",message="at most one of name, bridge and cidr may be set"
type ClusterNetwork struct {
	// name of an existing libvirt network to use. The provider never
	// deletes it; it only adds and removes DHCP host entries of its machines.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// bridge is an existing Linux bridge on the host (e.g. br0 on a
	// homelab LAN). Machines get addresses from the LAN's DHCP server and
	// the provider reads them through the guest agent.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_.-]{1,15}$`
	Bridge string `json:"bridge,omitempty"`

	// cidr of the NAT network the provider creates, e.g. 192.168.150.0/24,
	// within the ranges the operator allows (the manager's --network-cidrs,
	// by default 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16).
	// Empty means the provider picks a free /24 within them that overlaps
	// no host address, host route or other libvirt network.
	// +optional
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4",message="cidr must be an IPv4 CIDR such as 192.168.150.0/24"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || (cidr(self).prefixLength() >= 16 && cidr(self).prefixLength() <= 28)",message="cidr prefix length must be between /16 and /28"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).masked() == cidr(self)",message="cidr must have no host bits set (e.g. 192.168.150.0/24, not 192.168.150.1/24)"
	CIDR string `json:"cidr,omitempty"`
}

// LoadBalancer configures what serves the control-plane endpoint.
// +kubebuilder:validation:XValidation:rule="!(has(self.domainType) && self.domainType == 'qemu' && has(self.cpuMode) && self.cpuMode == 'host-passthrough')",message="cpuMode host-passthrough needs domainType kvm; use maximum with qemu"
// +kubebuilder:validation:XValidation:rule="(has(self.cpuMode) && self.cpuMode == 'custom') == has(self.cpuModel)",message="cpuModel is set exactly when cpuMode is custom"
// +kubebuilder:validation:XValidation:rule="!has(self.cpuFeatures) || (has(self.cpuMode) && self.cpuMode == 'custom')",message="cpuFeatures apply only to cpuMode custom"
type LoadBalancer struct {
	// type is HAProxy (a VM the provider runs) or None (the user brings
	// the endpoint, e.g. kube-vip).
	// +optional
	// +kubebuilder:default=HAProxy
	Type LoadBalancerType `json:"type,omitempty"`

	// image is the base image of the HAProxy VM; it must contain haproxy
	// (run by systemd), bash, cloud-init and qemu-guest-agent (see images/).
	// Empty means the volume capi-libvirt-haproxy.qcow2 in the cluster's
	// storage pool.
	// +optional
	Image *ImageSource `json:"image,omitempty"`

	// failureDomain is where the HAProxy VM runs: a failure domain whose
	// controlPlane is true. Empty means the first such failure domain listed.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	FailureDomain string `json:"failureDomain,omitempty"`

	// addressFromPool takes the HAProxy VM's address, which becomes the
	// control-plane endpoint, from a Cluster API IPAM pool instead of a
	// DHCP reservation or a controlPlaneEndpoint.host typed by hand: the
	// provider claims it (an IPAddressClaim owned by the LibvirtCluster,
	// released with the VM) and gives the VM the address, prefix and
	// gateway without DHCP. Only with type HAProxy on a host bridge or an
	// existing libvirt network. Immutable.
	// +optional
	AddressFromPool *IPPoolReference `json:"addressFromPool,omitempty"`

	// The HAProxy VM's hardware; defaults to 1 vCPU and 512 MiB.
	VirtualHardware `json:",inline"`
}

// StoragePool is a libvirt directory pool the provider ensures exists.
type StoragePool struct {
	// name of the pool; defaults to capi-libvirt.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_.-]+$`
	Name string `json:"name,omitempty"`

	// path of the pool's directory on the libvirt host; defaults to
	// /var/lib/libvirt/capi-libvirt. Used only when the pool is created.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	Path string `json:"path,omitempty"`
}

// FailureDomainSpec declares a failure domain of the cluster: a libvirt
// host its machines may be placed on.
// +kubebuilder:validation:XValidation:rule="!has(self.credentialsRef) || has(self.uri)",message="credentialsRef needs a uri"
type FailureDomainSpec struct {
	// name of the failure domain, as Machines refer to it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// controlPlane tells whether control-plane machines may be placed here.
	// +optional
	ControlPlane *bool `json:"controlPlane,omitempty"`

	// uri is the libvirt connection URI of the host, one of qemu:///system,
	// qemu+ssh://[user@]host[:port]/system (qemu+libssh:// and qemu+libssh2://
	// alike), qemu+tls://host[:port]/system or qemu+tcp://host[:port]/system,
	// without query parameters unless the operator listed the exact URI in
	// the manager's --libvirt-uris; a URI admitted only by * there needs
	// credentialsRef and a host outside the manager's
	// --image-url-deny-cidrs. Empty means the manager's --libvirt-uri.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	URI string `json:"uri,omitempty"`

	// credentialsRef names a Secret in the cluster's namespace with what the
	// connection to uri needs: ssh-privatekey and known_hosts for SSH (a
	// qemu+ssh URI then runs the OpenSSH client with that key and those host
	// keys only and nothing of the manager's SSH configuration; qemu+libssh
	// and qemu+libssh2 URIs use libvirt's libssh2 client with them), or
	// tls.crt, tls.key and ca.crt for TLS. Without it the manager connects
	// with its own credentials (its SSH configuration, its /etc/pki/libvirt),
	// which only the manager's own URI and those the operator lists exactly
	// in --libvirt-uris may do.
	// +optional
	CredentialsRef *SecretReference `json:"credentialsRef,omitempty"`

	// attributes are free-form and copied to the Cluster's failure domain.
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`
}

// SecretReference names a Secret in the referring object's namespace.
type SecretReference struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// LibvirtClusterStatus is the observed state of a LibvirtCluster.
type LibvirtClusterStatus struct {
	// conditions: Ready summarises NetworkReady and LoadBalancerReady;
	// Paused follows Cluster API's pause.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialization reports when the cluster infrastructure is provisioned:
	// the network exists and the control-plane endpoint accepts connections.
	// +optional
	Initialization Initialization `json:"initialization,omitempty,omitzero"`

	// ready mirrors initialization.provisioned for readers of the v1beta1 contract.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// failureDomains the cluster's machines may use.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	FailureDomains []clusterv1.FailureDomain `json:"failureDomains,omitempty"`

	// network shows the network the cluster's machines are plugged into.
	// +optional
	Network *NetworkStatus `json:"network,omitempty"`

	// storagePool is the pool spec.storagePool asked for, once the provider
	// defined, started and autostarted it: later reconciles leave the pool
	// alone until spec.storagePool names another (after clusterctl move,
	// which carries no status, it is ensured once more).
	// +optional
	StoragePool *StoragePoolStatus `json:"storagePool,omitempty"`

	// loadBalancer shows the HAProxy VM and the backends it serves.
	// +optional
	LoadBalancer *LoadBalancerStatus `json:"loadBalancer,omitempty"`

	// failureReason is set when the cluster infrastructure failed in a way
	// that needs a person (v1beta1 contract field).
	// +optional
	FailureReason *string `json:"failureReason,omitempty"`

	// failureMessage explains failureReason.
	// +optional
	FailureMessage *string `json:"failureMessage,omitempty"`
}

// NetworkStatus shows a cluster's network.
type NetworkStatus struct {
	// name of the libvirt network; empty for a host bridge.
	// +optional
	Name string `json:"name,omitempty"`
	// bridge is the Linux bridge the machines' NICs are plugged into.
	// +optional
	Bridge string `json:"bridge,omitempty"`
	// cidr of the network, when the provider knows it.
	// +optional
	CIDR string `json:"cidr,omitempty"`
	// managed is true when the provider created the network and will delete
	// it with the cluster.
	// +optional
	Managed bool `json:"managed,omitempty"`
}

// StoragePoolStatus is a storage pool the provider ensured.
type StoragePoolStatus struct {
	// name of the libvirt pool.
	Name string `json:"name"`
	// path of the pool's directory.
	Path string `json:"path"`
}

// LoadBalancerStatus shows the HAProxy VM.
type LoadBalancerStatus struct {
	// domain shows the HAProxy VM.
	// +optional
	Domain *DomainStatus `json:"domain,omitempty"`
	// address is the VM's reserved (on a host bridge: static) address,
	// the control-plane endpoint host.
	// +optional
	Address string `json:"address,omitempty"`
	// backends HAProxy currently forwards to.
	// +optional
	// +listType=map
	// +listMapKey=machine
	Backends []LoadBalancerBackend `json:"backends,omitempty"`
	// configHash identifies the configuration HAProxy last loaded; the
	// controller reloads HAProxy only when the rendered configuration differs.
	// +optional
	ConfigHash string `json:"configHash,omitempty"`
	// lastReloadTime is when HAProxy last loaded a new configuration.
	// +optional
	LastReloadTime *metav1.Time `json:"lastReloadTime,omitempty"`
	// notServingSince is when the endpoint was first found not accepting
	// connections since it last did; unset while it does. Past a bound
	// (15 minutes) LoadBalancerReady says LoadBalancerNotServing.
	// +optional
	NotServingSince *metav1.Time `json:"notServingSince,omitempty"`
}

// BackendState tells whether HAProxy sends new connections to a backend.
// +kubebuilder:validation:Enum=Active;Draining
type BackendState string

const (
	// BackendActive receives new connections while its health check passes.
	BackendActive BackendState = "Active"
	// BackendDraining receives no new connections: its Machine is being deleted.
	BackendDraining BackendState = "Draining"
)

// LoadBalancerBackend is one control-plane machine behind the endpoint.
type LoadBalancerBackend struct {
	// machine is the name of the control-plane Machine.
	// +required
	Machine string `json:"machine"`
	// address is the machine's address HAProxy connects to.
	// +optional
	Address string `json:"address,omitempty"`
	// state is Active or Draining.
	// +optional
	State BackendState `json:"state,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=libvirtclusters,scope=Namespaced,categories=cluster-api
// +kubebuilder:storageversion
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",description="Cluster to which this LibvirtCluster belongs"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status",description="Network, load balancer and endpoint ready (the Ready condition)"
// +kubebuilder:printcolumn:name="Provisioned",type="boolean",JSONPath=".status.initialization.provisioned",description="Cluster infrastructure is provisioned"
// +kubebuilder:printcolumn:name="Endpoint",type="string",JSONPath=".spec.controlPlaneEndpoint.host",description="Control-plane endpoint host"
// +kubebuilder:printcolumn:name="Network",type="string",JSONPath=".status.network.name",description="libvirt network of the cluster"
// +kubebuilder:printcolumn:name="CIDR",type="string",JSONPath=".status.network.cidr",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// LibvirtCluster is the infrastructure of one Cluster API cluster on a
// libvirt host: its network and the VM serving its control-plane endpoint.
type LibvirtCluster struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +optional
	Spec LibvirtClusterSpec `json:"spec,omitempty,omitzero"`
	// status is the observed state.
	// +optional
	Status LibvirtClusterStatus `json:"status,omitempty,omitzero"`
}

// GetConditions returns the conditions, for Cluster API's condition utilities.
func (c *LibvirtCluster) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions replaces the conditions, for Cluster API's condition utilities.
func (c *LibvirtCluster) SetConditions(conditions []metav1.Condition) {
	c.Status.Conditions = conditions
}

// +kubebuilder:object:root=true

// LibvirtClusterList is a list of LibvirtClusters.
type LibvirtClusterList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the LibvirtClusters.
	Items []LibvirtCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&LibvirtCluster{}, &LibvirtClusterList{})
}
