package webhooks

import (
	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// The defaults below are the ones the controllers apply to zero fields
// (pkg/scope), written into the object so that users see them. They never
// depend on anything outside the object: the topology controller compares a
// ClusterClass's templates with a cluster's through dry-run requests, and a
// default that changed with the state of the host would look like an edit.

// DefaultClusterSpec fills the zero fields of a LibvirtCluster's spec.
func DefaultClusterSpec(spec *infrav1.LibvirtClusterSpec) {
	lb := &spec.LoadBalancer
	if lb.Type == "" {
		lb.Type = infrav1.LoadBalancerHAProxy
	}
	if lb.Type == infrav1.LoadBalancerHAProxy {
		lb.VirtualHardware.Default(infrav1.DefaultLoadBalancerCPUs, infrav1.DefaultLoadBalancerMemoryMiB)
	}
	// The HAProxy VM listens on the API server's port; with type None the
	// user's endpoint gets the port only once it names a host.
	if spec.ControlPlaneEndpoint.Port == 0 && (spec.ControlPlaneEndpoint.Host != "" || lb.Type == infrav1.LoadBalancerHAProxy) {
		spec.ControlPlaneEndpoint.Port = infrav1.DefaultAPIServerPort
	}
	// A named pool without a path must already exist (the controllers do
	// not guess where to create it), so the default path goes only with
	// the default name.
	if spec.StoragePool.Name == "" {
		spec.StoragePool.Name = infrav1.DefaultStoragePoolName
		if spec.StoragePool.Path == "" {
			spec.StoragePool.Path = infrav1.DefaultStoragePoolPath
		}
	}
}

// DefaultMachineSpec fills the zero fields of a LibvirtMachine's spec. The
// image's pool stays empty: it means the cluster's pool, which a template
// shared by several clusters cannot name.
func DefaultMachineSpec(spec *infrav1.LibvirtMachineSpec) {
	spec.VirtualHardware.Default(infrav1.DefaultMachineCPUs, infrav1.DefaultMachineMemoryMiB)
	if spec.DiskSizeGiB == 0 {
		spec.DiskSizeGiB = infrav1.DefaultDiskSizeGiB
	}
}
