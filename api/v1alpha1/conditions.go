package v1alpha1

// Condition types and reasons of LibvirtCluster. Ready summarises the
// others; Paused is Cluster API's clusterv1.PausedCondition.
const (
	// NetworkReadyCondition tells whether the cluster's network exists and runs.
	NetworkReadyCondition = "NetworkReady"
	// NetworkNotFoundReason: the named libvirt network or bridge does not exist.
	NetworkNotFoundReason = "NetworkNotFound"

	// LoadBalancerReadyCondition tells whether the control-plane endpoint
	// accepts connections.
	LoadBalancerReadyCondition = "LoadBalancerReady"
	// LoadBalancerDisabledReason: type None, the user serves the endpoint.
	LoadBalancerDisabledReason = "Disabled"
	// WaitingForLoadBalancerReason: the HAProxy VM is booting.
	WaitingForLoadBalancerReason = "WaitingForLoadBalancer"
	// LoadBalancerNotServingReason: HAProxy has not accepted connections
	// for longer than the VM needs to boot; the provider keeps trying.
	LoadBalancerNotServingReason = "LoadBalancerNotServing"

	// NetworkInactiveReason: the named libvirt network exists but is not
	// running; the provider does not start networks it does not own.
	NetworkInactiveReason = "NetworkInactive"
	// NetworkInUseReason: on delete, domains the provider does not manage
	// still use the cluster's network; the message names them.
	NetworkInUseReason = "NetworkInUse"

	// StoragePoolReadyCondition tells whether the cluster's storage pool
	// exists and runs.
	StoragePoolReadyCondition = "StoragePoolReady"

	// ControlPlaneEndpointMissingReason: load balancer type None, or the
	// HAProxy VM on a host bridge (which holds it as a static address), and
	// spec.controlPlaneEndpoint is not set.
	ControlPlaneEndpointMissingReason = "ControlPlaneEndpointMissing"
	// ControlPlaneEndpointConflictReason: spec.controlPlaneEndpoint.host
	// names another address than the HAProxy VM's.
	ControlPlaneEndpointConflictReason = "ControlPlaneEndpointConflict"
	// UnsupportedNetworkReason: the HAProxy VM on a libvirt network needs
	// DHCP served by libvirt, so that its address is reserved before it
	// boots; a network without it needs type None. On a host bridge the VM
	// holds the user's endpoint as a static address instead, which the
	// manager's traffic filter, when on, forbids.
	UnsupportedNetworkReason = "UnsupportedNetwork"
	// LoadBalancerConfigInvalidReason: `haproxy -c` rejected the rendered
	// configuration; the running one was kept.
	LoadBalancerConfigInvalidReason = "ConfigInvalid"
	// LoadBalancerReloadFailedReason: HAProxy did not load the new
	// configuration after a reload; the message carries its log.
	LoadBalancerReloadFailedReason = "ReloadFailed"
	// WaitingForMachinesDeletionReason: on delete, LibvirtMachines of the
	// cluster remain; the network and load balancer outlive them.
	WaitingForMachinesDeletionReason = "WaitingForMachinesDeletion"
)

// Condition types and reasons of LibvirtMachine. Ready summarises the
// provisioning steps, each of which has its own condition.
const (
	// AddressReservedCondition tells whether the machine's IP is reserved
	// for its MAC in the network's DHCP server, or claimed from the pools
	// of network.addressesFromPools.
	AddressReservedCondition = "AddressReserved"
	// AddressConflictReason: the address or MAC cannot be reserved because
	// another host entry or a lease holds it; the message names the holder.
	AddressConflictReason = "AddressConflict"
	// ReservationNotSupportedReason (status True): the machine is on a host
	// bridge or a network whose DHCP libvirt does not serve, so there is
	// nothing to reserve; its address comes from the guest agent.
	ReservationNotSupportedReason = "ReservationNotSupported"
	// WaitingForNetworkReason: the LibvirtCluster has not reported its
	// network yet, or the named network does not exist or is not active.
	WaitingForNetworkReason = "WaitingForNetwork"
	// WaitingForIPAddressReason: an IPAddressClaim of
	// network.addressesFromPools has no IPAddress yet; the message names
	// the claim and its pool.
	WaitingForIPAddressReason = "WaitingForIPAddress"
	// IPAddressInvalidReason: the IPAddress a pool gave cannot be used (it
	// is not the claim's, does not parse, or lies outside the operator's
	// --pool-address-cidrs).
	IPAddressInvalidReason = "IPAddressInvalid"
	// AddressInUseReason: the address a pool gave is not free on the
	// segment: it is the libvirt host's own or the network's gateway, lies
	// in a libvirt network's DHCP range, is reserved or leased there for
	// another MAC, or another VM (of any namespace) holds it statically;
	// nothing is created.
	AddressInUseReason = "AddressInUse"
	// IPAddressChangedReason: the IPAddress of a claim differs from the
	// address the VM's domain was defined with (a deleted claim re-created
	// and given another address): the guest keeps the one it holds.
	IPAddressChangedReason = "IPAddressChanged"
	// IPPoolNotAllowedReason: network.addressesFromPools (or
	// loadBalancer.addressFromPool) names a pool the operator's
	// --ipam-pools does not grant the namespace.
	IPPoolNotAllowedReason = "IPPoolNotAllowed"
	// MACNotOwnedReason: the MAC recorded on the object (its annotation)
	// was not derived by the provider from the domain's UUID and no domain
	// of this object uses it, or another domain on the segment uses it;
	// nothing is created.
	MACNotOwnedReason = "MACNotOwned"

	// DiskReadyCondition tells whether the root overlay volume exists.
	DiskReadyCondition = "DiskReady"
	// ImageNotFoundReason: the base image volume or URL does not exist.
	ImageNotFoundReason = "ImageNotFound"
	// BaseImageMissingReason: the root disk exists but the base image it
	// is backed by is gone; the disk is not reused.
	BaseImageMissingReason = "BaseImageMissing"
	// ImageChecksumMismatchReason: the image at url does not match its checksum.
	ImageChecksumMismatchReason = "ImageChecksumMismatch"
	// PoolFullReason: the storage pool has no space left.
	PoolFullReason = "PoolFull"
	// StoragePoolNotFoundReason (DiskReady): a data disk names a storage
	// pool that does not exist on the machine's libvirt host.
	StoragePoolNotFoundReason = "StoragePoolNotFound"
	// ImageHasBackingFileReason: the image is a qcow2 whose header names
	// a backing file, which would make the host open that file. Nothing
	// of it is kept; flatten it (qemu-img convert -O qcow2) and serve that.
	ImageHasBackingFileReason = "ImageHasBackingFile"
	// ImageHasDataFileReason: the image is a qcow2 whose data lives in an
	// external file named by host path. Nothing of it is kept.
	ImageHasDataFileReason = "ImageHasDataFile"
	// ImageFormatUnsupportedReason: the image is neither raw nor qcow2
	// (v2/v3): vmdk, qed, vhdx and the like are refused.
	ImageFormatUnsupportedReason = "ImageFormatUnsupported"
	// ImageLargerThanDiskReason: the base image's virtual size is larger
	// than diskSizeGiB; the disk is not made larger than asked.
	ImageLargerThanDiskReason = "ImageLargerThanDisk"
	// ImageTooLargeReason: the image is longer than the operator's bound
	// (the manager's --image-import-max-size); nothing of it is kept.
	ImageTooLargeReason = "ImageTooLarge"
	// ImageSourceNotAllowedReason: the URL leads where the operator does
	// not let imports go: a file outside --image-file-dirs, an address of
	// --image-url-deny-cidrs, or a redirect that is not followed.
	ImageSourceNotAllowedReason = "ImageSourceNotAllowed"
	// ImageNotAllowedReason: image.volume names no base image: a volume
	// the provider manages for a machine or load balancer (of any
	// namespace), or a volume outside the operator's image pools; or
	// image.url is a file:// URL outside --image-file-dirs. Nothing
	// is created; replace the object. Also on LibvirtCluster's
	// LoadBalancerReady for loadBalancer.image.
	ImageNotAllowedReason = "ImageNotAllowed"
	// WaitingForImageImportReason: the base image at url is being
	// imported into the pool; the message shows the progress.
	WaitingForImageImportReason = "WaitingForImageImport"
	// ImageImportFailedReason: the import of the image at url failed (a
	// timeout, a refused connection, an HTTP error); it is retried with backoff.
	ImageImportFailedReason = "ImageImportFailed"

	// BootstrapDataReadyCondition tells whether the NoCloud seed ISO built
	// from the bootstrap Secret is uploaded.
	BootstrapDataReadyCondition = "BootstrapDataReady"
	// WaitingForBootstrapDataReason: Machine.spec.bootstrap.dataSecretName is unset.
	WaitingForBootstrapDataReason = "WaitingForBootstrapData"
	// UnsupportedBootstrapFormatReason: the Secret's format is not cloud-config.
	UnsupportedBootstrapFormatReason = "UnsupportedBootstrapFormat"
	// BootstrapSecretNotFoundReason: the Secret named by
	// Machine.spec.bootstrap.dataSecretName does not exist or has no value.
	BootstrapSecretNotFoundReason = "BootstrapSecretNotFound"

	// DomainReadyCondition tells whether the libvirt domain runs.
	DomainReadyCondition = "DomainReady"
	// DomainFailedToStartReason: libvirt refused to start the domain; the
	// message carries libvirt's error.
	DomainFailedToStartReason = "FailedToStart"
	// DomainCrashedReason: the domain crashed or stopped outside the provider.
	DomainCrashedReason = "Crashed"
	// WaitingForHostDeviceReason: a PCI device of spec.hostDevices is not
	// on the machine's host (its address is missing, or the operator
	// bound the alias to another host), or another running domain holds it; the
	// message names the device and the domain. Nothing is created until it
	// is free; a machine the provider places goes only to a host that has
	// it free.
	WaitingForHostDeviceReason = "WaitingForHostDevice"
	// HostDeviceNotAllowedReason: spec.hostDevices names an alias the
	// operator did not list (--host-devices), or the device at its address
	// on the machine's host is a storage, network or bridge device the
	// operator did not allow, has no IOMMU group, or shares its IOMMU
	// group with a device the host still uses. Nothing is created.
	HostDeviceNotAllowedReason = "HostDeviceNotAllowed"
	// HostDeviceMismatchReason: the device at the address of a
	// spec.hostDevices alias on the machine's host has other vendor and
	// device IDs than the operator's --host-devices names for the alias.
	// Nothing is created.
	HostDeviceMismatchReason = "HostDeviceMismatch"
	// DomainMissingReason: the provisioned domain vanished or was replaced.
	DomainMissingReason = "DomainMissing"
	// HardwareDriftReason: the domain's CPUs or memory differ from the spec;
	// the provider reports this and never recreates the VM to fix it. The
	// condition stays True: the domain runs.
	HardwareDriftReason = "HardwareDrift"
	// DomainPausedReason: libvirt paused the domain, e.g. on an I/O error
	// such as a full storage pool; the message carries libvirt's reason.
	DomainPausedReason = "DomainPaused"
	// InsufficientHostMemoryReason: the spec asks more memory than the
	// libvirt host has in total; no domain is defined. The message gives
	// both figures. Memory is immutable: replace the machine.
	InsufficientHostMemoryReason = "InsufficientHostMemory"

	// AddressAssignedCondition tells whether the guest has its address.
	AddressAssignedCondition = "AddressAssigned"
	// WaitingForAddressReason: no DHCP lease for the machine's MAC yet.
	WaitingForAddressReason = "WaitingForAddress"

	// BootstrapSucceededCondition reports the bootstrap sentinel file read
	// through the guest agent.
	BootstrapSucceededCondition = "BootstrapSucceeded"
	// WaitingForBootstrapReason: cloud-init has not finished the bootstrap.
	WaitingForBootstrapReason = "WaitingForBootstrap"
	// BootstrapFailedReason: cloud-init reported a failure.
	BootstrapFailedReason = "BootstrapFailed"
	// GuestAgentUnavailableReason: the sentinel file cannot be read because
	// the guest agent does not answer (yet); the message says why.
	GuestAgentUnavailableReason = "GuestAgentUnavailable"
)

// Reasons shared by both kinds.
const (
	// WaitingForClusterInfrastructureReason: the LibvirtCluster is not provisioned yet.
	WaitingForClusterInfrastructureReason = "WaitingForClusterInfrastructure"
	// ReadyReason: the step is done.
	ReadyReason = "Ready"
	// ProvisioningReason: the step is under way.
	ProvisioningReason = "Provisioning"
	// DeletingReason: the object is being deleted.
	DeletingReason = "Deleting"
	// LibvirtErrorReason: libvirt returned an error the provider retries;
	// the message carries it.
	LibvirtErrorReason = "LibvirtError"
	// StoragePoolNotAllowedReason: the storage pool's path is not below
	// the operator's storage pool directories (or is a system directory),
	// or its name is not among the operator's pools. Nothing is created.
	// On LibvirtCluster's StoragePoolReady and LibvirtMachine's DiskReady.
	StoragePoolNotAllowedReason = "StoragePoolNotAllowed"
	// MachineSizeNotAllowedReason (DomainReady): the machine asks for
	// more vCPUs, memory or disk than the operator allows one machine
	// (--max-machine-*). Nothing is created; replace the machine.
	MachineSizeNotAllowedReason = "MachineSizeNotAllowed"
	// NamespaceQuotaExceededReason (DomainReady): with this machine the
	// namespace's machines would pass the operator's totals
	// (--namespace-max-*). Nothing is created; the machine waits until
	// machines created before it are deleted.
	NamespaceQuotaExceededReason = "NamespaceQuotaExceeded"
	// NetworkNotAllowedReason: the network is another namespace's cluster
	// network, the bridge is one of the provider's networks, the operator
	// did not list it, or the network the provider would create has a
	// range outside the operator's (--network-cidrs). Nothing is created.
	// On LibvirtCluster's NetworkReady and LibvirtMachine's
	// AddressReserved.
	NetworkNotAllowedReason = "NetworkNotAllowed"
	// HostUnreachableReason: the libvirt host of the object's failure
	// domain does not answer (its libvirtd stopped, the host or the
	// network is down, its credentials are refused); the message names the
	// URI and the error. Nothing is changed there until it answers again;
	// a deletion waits for it. On LibvirtMachine's DomainReady and
	// LibvirtCluster's NetworkReady and LoadBalancerReady.
	HostUnreachableReason = "HostUnreachable"
	// FailureDomainNotFoundReason (DomainReady): the Machine names a
	// failure domain the LibvirtCluster does not list, or none of the
	// listed ones may hold it (a control-plane machine needs one whose
	// controlPlane is true). Nothing is created.
	FailureDomainNotFoundReason = "FailureDomainNotFound"
	// HostNotAllowedReason: a failure domain names a libvirt URI the
	// operator does not allow (the manager's --libvirt-uris); nothing is
	// dialled. On the same conditions as HostUnreachableReason.
	HostNotAllowedReason = "HostNotAllowed"
)
