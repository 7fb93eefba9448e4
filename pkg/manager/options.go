// Package manager builds the provider's controller-runtime manager from
// command-line options, so that the manager binary, the embedded management
// plane and the integration tests all run the same wiring.
package manager

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/spf13/pflag"
	"sigs.k8s.io/cluster-api/util/flags"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// DefaultLibvirtURI is the libvirt connection used when none is given.
const DefaultLibvirtURI = "qemu:///system"

// Options are the manager's settings; AddFlags binds them to flags.
type Options struct {
	// LibvirtURI is the libvirt host the controllers manage (qemu:///system,
	// qemu+ssh://user@host/system, qemu+tls://host/system).
	LibvirtURI string
	// WatchNamespace limits the manager to one namespace; empty watches all.
	WatchNamespace string
	// WatchFilterValue limits reconciliation to objects whose
	// cluster.x-k8s.io/watch-filter label has this value.
	WatchFilterValue string

	// LeaderElect enables leader election so that only one replica reconciles.
	LeaderElect bool
	// LeaderElectionID names the Lease object used for leader election.
	LeaderElectionID string
	// LeaderElectionNamespace holds the Lease; empty uses the in-cluster namespace.
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// HealthAddr serves /healthz and /readyz.
	HealthAddr string
	// ProfilerAddr serves pprof when set.
	ProfilerAddr string
	// Diagnostics holds Cluster API's metrics and TLS flags.
	Diagnostics flags.ManagerOptions

	// ClusterConcurrency and MachineConcurrency are how many objects of
	// each kind are reconciled at once.
	ClusterConcurrency, MachineConcurrency int
	// SyncPeriod is the minimum interval at which every object is reconciled again.
	SyncPeriod time.Duration

	// ImageImport bounds the downloads of base images given by URL and
	// spaces the retries of failed ones; ImageImportOptions completes its
	// Sources from the fields below.
	ImageImport imageimport.Options
	// ImageURLDenyCIDRs are the addresses image downloads never connect
	// to; ImageImportMaxSize bounds an image's length (a quantity such as
	// "32Gi"; empty or 0: no bound). ImageImportOptions parses both.
	ImageURLDenyCIDRs  []string
	ImageImportMaxSize string

	// WebhookHost is the address the webhook server binds to; empty
	// binds every interface, as a Pod reached through its Service needs.
	// The one-host plane binds loopback, where its API server calls, so
	// that guests cannot reach the server through their gateway.
	WebhookHost string
	// WebhookPort is the webhook server's port.
	WebhookPort int
	// WebhookCertDir holds tls.crt and tls.key for the webhook server.
	WebhookCertDir string

	// StoragePoolDirs, StoragePools, ImagePools, HostBridges,
	// LibvirtNetworks and ImageFileDirs are what tenants may name
	// (tenancy.Policy).
	StoragePoolDirs, StoragePools, ImagePools, HostBridges, LibvirtNetworks, ImageFileDirs []string

	// MaxMachineVCPUs, MaxMachineMemory and MaxMachineDisk bound one
	// machine; NamespaceMaxMachines, NamespaceMaxVCPUs and
	// NamespaceMaxMemory bound a namespace's machines together. Sizes are
	// quantities ("64Gi"); zero sets no bound. Tenancy parses them.
	MaxMachineVCPUs, NamespaceMaxMachines, NamespaceMaxVCPUs int
	MaxMachineMemory, MaxMachineDisk, NamespaceMaxMemory     string
	// NamespaceMaxClusters bounds a namespace's LibvirtClusters (each a
	// network and maybe an HAProxy VM); NamespaceMaxDisk what its volumes
	// take on the hosts (a quantity).
	NamespaceMaxClusters int
	NamespaceMaxDisk     string
	// NamespaceMaxHostDevices bounds the PCI devices a namespace's
	// domains pass through together.
	NamespaceMaxHostDevices int

	// TrafficFilter is the nwfilter of machines on shared segments
	// ("none" for none).
	TrafficFilter string

	// LibvirtURIs are the libvirt hosts besides LibvirtURI that failure
	// domains may name (tenancy.Policy.LibvirtURIs).
	LibvirtURIs []string
	// HostPruneInterval is how often connections to hosts no cluster
	// names any more are closed.
	HostPruneInterval time.Duration

	// NetworkCIDRs are the ranges the networks the provider creates may
	// use (tenancy.Policy.NetworkCIDRs): CIDRs, * or none.
	NetworkCIDRs []string
	// PoolAddressCIDRs are the ranges machines' IPAM addresses may lie in
	// (tenancy.Policy.PoolAddressCIDRs): CIDRs, * or none; nil or empty
	// is none, the flag's default.
	PoolAddressCIDRs []string
	// IPAMPools grant namespaces IPAM pools (tenancy.ParseIPAMPools):
	// NAMESPACE=KIND/NAME entries or none; nil is the flag's default,
	// tenancy.DefaultIPAMPools.
	IPAMPools []string
	// HostDevices are the PCI devices machines may take, ALIAS=ADDRESS
	// with an optional /RESOURCE (tenancy.ParseHostDevices).
	HostDevices []string
}

// ImageImportOptions are the image imports' options with the deny-list
// and size bound parsed; an error names the flag that is wrong.
func (o *Options) ImageImportOptions() (imageimport.Options, error) {
	opts := o.ImageImport
	opts.Sources.FileDirs = o.ImageFileDirs
	opts.Sources.DenyNets = nil
	for _, c := range o.ImageURLDenyCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return opts, fmt.Errorf("invalid --image-url-deny-cidrs entry %q: %w", c, err)
		}
		opts.Sources.DenyNets = append(opts.Sources.DenyNets, p.Masked())
	}
	opts.Sources.MaxBytes = 0
	if o.ImageImportMaxSize != "" {
		q, err := resource.ParseQuantity(o.ImageImportMaxSize)
		if err != nil || q.Sign() < 0 {
			return opts, fmt.Errorf("invalid --image-import-max-size %q: a size such as 32Gi is needed", o.ImageImportMaxSize)
		}
		opts.Sources.MaxBytes = q.Value()
	}
	return opts, nil
}

// Tenancy is the policy of what tenants may name and use that the options
// set; an error names the flag whose value does not parse.
func (o *Options) Tenancy() (tenancy.Policy, error) {
	p := tenancy.Policy{
		PoolDirs: o.StoragePoolDirs, Pools: o.StoragePools, ImagePools: o.ImagePools,
		Bridges: o.HostBridges, Networks: o.LibvirtNetworks, ImageFileDirs: o.ImageFileDirs,
		ManagerURI: o.LibvirtURI, LibvirtURIs: o.LibvirtURIs,
		Machine: tenancy.Limits{VCPUs: int64(o.MaxMachineVCPUs)},
		Namespace: tenancy.Limits{Machines: o.NamespaceMaxMachines, Clusters: o.NamespaceMaxClusters, VCPUs: int64(o.NamespaceMaxVCPUs),
			HostDevices: o.NamespaceMaxHostDevices},
	}
	switch o.TrafficFilter {
	case "none", "":
	default:
		p.TrafficFilter = o.TrafficFilter
	}
	// Libvirt hosts are denied the addresses image downloads are.
	imports, err := o.ImageImportOptions()
	if err != nil {
		return p, err
	}
	p.HostDenyNets = imports.Sources.DenyNets
	cidrs := o.NetworkCIDRs
	if cidrs == nil { // Options made in code, not by AddFlags: the flag's default
		cidrs = tenancy.DefaultNetworkCIDRs
	}
	if p.NetworkCIDRs, err = tenancy.ParseNetworkCIDRs(cidrs); err != nil {
		return p, fmt.Errorf("invalid --network-cidrs: %w", err)
	}
	p.PoolAddressCIDRs = []netip.Prefix{} // none until the operator names ranges
	if len(o.PoolAddressCIDRs) > 0 {
		if p.PoolAddressCIDRs, err = tenancy.ParseNetworkCIDRs(o.PoolAddressCIDRs); err != nil {
			return p, fmt.Errorf("invalid --pool-address-cidrs: %w", err)
		}
	}
	grants := o.IPAMPools
	if grants == nil { // Options made in code, not by AddFlags: the flag's default
		grants = tenancy.DefaultIPAMPools
	}
	if p.IPAMPools, err = tenancy.ParseIPAMPools(grants); err != nil {
		return p, fmt.Errorf("invalid --ipam-pools: %w", err)
	}
	if p.HostDevices, err = tenancy.ParseHostDevices(o.HostDevices); err != nil {
		return p, fmt.Errorf("invalid --host-devices: %w", err)
	}
	for _, q := range []struct {
		flag, value string
		into        *int64
		unit        int64
	}{
		{"--max-machine-memory", o.MaxMachineMemory, &p.Machine.MemoryMiB, 1 << 20},
		{"--max-machine-disk", o.MaxMachineDisk, &p.Machine.DiskGiB, 1 << 30},
		{"--namespace-max-memory", o.NamespaceMaxMemory, &p.Namespace.MemoryMiB, 1 << 20},
		{"--namespace-max-disk", o.NamespaceMaxDisk, &p.Namespace.DiskGiB, 1 << 30},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil || v.Sign() < 0 {
			return p, fmt.Errorf("invalid %s %q: a size such as 64Gi is needed", q.flag, q.value)
		}
		*q.into = v.Value() / q.unit
	}
	return p, nil
}

// AddFlags binds every option to a flag named as Cluster API providers name
// them, so that users of CAPD, CAPA or CAPZ find the same switches.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.LibvirtURI, "libvirt-uri", DefaultLibvirtURI,
		"libvirt connection URI of the host that runs the machines (qemu:///system, qemu+ssh://user@host/system, qemu+tls://host/system).")
	fs.StringVar(&o.WatchNamespace, "namespace", "",
		"Namespace that the controller watches to reconcile objects. If unspecified, the controller watches all namespaces.")
	fs.StringVar(&o.WatchFilterValue, "watch-filter", "",
		"Label value that the controller watches to reconcile objects: only objects with the label cluster.x-k8s.io/watch-filter set to it are reconciled.")

	fs.BoolVar(&o.LeaderElect, "leader-elect", false,
		"Enable leader election for the controller manager, ensuring there is only one active controller manager.")
	fs.StringVar(&o.LeaderElectionID, "leader-elect-id", "controller-leader-election-capl",
		"Name of the Lease used for leader election.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-elect-namespace", "",
		"Namespace of the leader election Lease; defaults to the namespace the manager runs in.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"Interval at which non-leader candidates will wait to force acquire leadership.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"Duration that the leading controller manager will retry refreshing leadership before giving up.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", 2*time.Second,
		"Duration the LeaderElector clients should wait between tries of actions.")

	fs.StringVar(&o.HealthAddr, "health-addr", ":9440", "The address the health endpoint binds to.")
	fs.StringVar(&o.ProfilerAddr, "profiler-address", "", "Bind address to expose the pprof profiler (e.g. localhost:6060).")
	flags.AddManagerOptions(fs, &o.Diagnostics)

	fs.IntVar(&o.ClusterConcurrency, "libvirtcluster-concurrency", 10,
		"Number of LibvirtClusters to process simultaneously.")
	fs.IntVar(&o.MachineConcurrency, "libvirtmachine-concurrency", 10,
		"Number of LibvirtMachines to process simultaneously.")
	fs.DurationVar(&o.SyncPeriod, "sync-period", 10*time.Minute,
		"The minimum interval at which watched resources are reconciled (e.g. 15m).")

	fs.DurationVar(&o.ImageImport.Fetch.ConnectTimeout, "image-import-connect-timeout", imageimport.DefaultConnectTimeout,
		"Bound on connecting to an image URL's server (TCP and TLS).")
	fs.DurationVar(&o.ImageImport.Fetch.HeaderTimeout, "image-import-header-timeout", imageimport.DefaultHeaderTimeout,
		"Bound on the wait for an image server's response headers once the request was sent.")
	fs.DurationVar(&o.ImageImport.Fetch.IdleTimeout, "image-import-idle-timeout", imageimport.DefaultIdleTimeout,
		"An image download that receives no data for this long fails.")
	fs.DurationVar(&o.ImageImport.Deadline, "image-import-timeout", imageimport.DefaultDeadline,
		"Bound on one attempt of an image import, download and upload into the pool.")
	fs.StringSliceVar(&o.ImageFileDirs, "image-file-dirs", nil,
		"Directories on the manager's host whose files image.url may name as file:// URLs (comma-separated); empty refuses file:// images. Symlinks do not lead out of them.")
	fs.StringSliceVar(&o.ImageURLDenyCIDRs, "image-url-deny-cidrs", slices.Clone(imageimport.DefaultDenyCIDRs),
		"Addresses image downloads never connect to, checked on every connection including redirects (comma-separated CIDRs); empty denies none.")
	fs.StringVar(&o.ImageImportMaxSize, "image-import-max-size", "32Gi",
		"Longest image an import takes, announced or streamed (a quantity such as 32Gi; 0: no bound).")
	fs.DurationVar(&o.ImageImport.MinBackoff, "image-import-min-backoff", imageimport.DefaultMinBackoff,
		"Wait before the first retry of a failed image import; it doubles with each failure.")
	fs.DurationVar(&o.ImageImport.MaxBackoff, "image-import-max-backoff", imageimport.DefaultMaxBackoff,
		"Longest wait between retries of a failed image import.")
	fs.DurationVar(&o.ImageImport.GCAfter, "image-gc-after", imageimport.DefaultGCAfter,
		"How long an image imported from a URL stays in its pool once no disk is backed by it and no machine asked for it (checked every min(this/2, 10m)); 0 keeps imported images forever.")

	fs.StringVar(&o.WebhookHost, "webhook-host", "",
		"Address the webhook server binds to (e.g. 127.0.0.1 when the API server runs on this host); empty binds every interface.")
	fs.IntVar(&o.WebhookPort, "webhook-port", 9443, "Webhook server port.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs/",
		"Directory holding the webhook server's tls.crt and tls.key.")

	fs.StringSliceVar(&o.StoragePoolDirs, "storage-pool-dirs", slices.Clone(tenancy.DefaultPoolDirs),
		"Directories on the libvirt host below which LibvirtClusters may have storage pools created (comma-separated). / and system directories are refused even if listed.")
	fs.StringSliceVar(&o.StoragePools, "storage-pools", nil,
		"Storage pools LibvirtClusters and LibvirtMachines may use (comma-separated); empty or * allows any pool name.")
	fs.StringSliceVar(&o.ImagePools, "image-pools", slices.Clone(tenancy.DefaultImagePools),
		"Storage pools whose volumes are base images any namespace may name in image.volume (comma-separated); images the provider imported from a URL are always allowed.")
	fs.StringSliceVar(&o.HostBridges, "host-bridges", nil,
		"Host bridges clusters and machines may be plugged into (comma-separated); empty or * allows any bridge but those of the provider's networks.")
	fs.IntVar(&o.MaxMachineVCPUs, "max-machine-vcpus", 32, "Most vCPUs one LibvirtMachine may ask for; 0 sets no bound.")
	fs.StringVar(&o.MaxMachineMemory, "max-machine-memory", "128Gi", "Most memory one LibvirtMachine may ask for (a quantity); 0 sets no bound.")
	fs.StringVar(&o.MaxMachineDisk, "max-machine-disk", "1Ti", "Most disk one LibvirtMachine may ask for, its root disk and data disks together (a quantity); 0 sets no bound.")
	fs.IntVar(&o.NamespaceMaxMachines, "namespace-max-machines", 0,
		"Most LibvirtMachines of one namespace that get a domain, counted as they exist in libvirt (a VM whose object is gone still counts); machines created later wait. 0 sets no bound.")
	fs.IntVar(&o.NamespaceMaxVCPUs, "namespace-max-vcpus", 0, "Most vCPUs the VMs of one namespace (its machines and HAProxy VMs, counted as they exist in libvirt) may take together; 0 sets no bound.")
	fs.StringVar(&o.NamespaceMaxMemory, "namespace-max-memory", "0",
		"Most memory the VMs of one namespace (its machines and HAProxy VMs, counted as they exist in libvirt) may take together (a quantity); 0 sets no bound.")
	fs.IntVar(&o.NamespaceMaxHostDevices, "namespace-max-host-devices", 0,
		"Most PCI devices the domains of one namespace may pass through together (spec.hostDevices, counted from the hostdevs of its domains in libvirt); 0 sets no bound.")
	fs.IntVar(&o.NamespaceMaxClusters, "namespace-max-clusters", 0,
		"Most LibvirtClusters of one namespace that get a network and HAProxy VM; clusters created later wait. 0 sets no bound.")
	fs.StringVar(&o.NamespaceMaxDisk, "namespace-max-disk", "0",
		"Most disk the volumes of one namespace may take on the libvirt hosts together: root disks at their full size, seeds, console logs (a quantity); 0 sets no bound.")
	fs.StringVar(&o.TrafficFilter, "traffic-filter", virt.CleanTrafficFilter,
		"libvirt nwfilter bound to the NIC of machines on a host bridge or on a libvirt network the provider did not make for their cluster (clean-traffic: no MAC, IP or ARP spoofing); none disables it, for segments where every guest is trusted (e.g. kube-vip announcing a VIP on a bridge).")
	fs.StringSliceVar(&o.LibvirtURIs, "libvirt-uris", nil,
		"libvirt URIs besides --libvirt-uri that LibvirtCluster failure domains may name, to spread a cluster over several hosts (comma-separated, compared exactly); * allows any qemu+ssh, qemu+libssh, qemu+libssh2 or qemu+tls URI of /system without query parameters whose failure domain has a credentialsRef and whose host is outside --image-url-deny-cidrs (a name is resolved on every connect). Empty allows none.")
	fs.DurationVar(&o.HostPruneInterval, "host-prune-interval", 5*time.Minute,
		"How often connections to libvirt hosts that no LibvirtCluster names any more are closed.")
	fs.StringSliceVar(&o.LibvirtNetworks, "libvirt-networks", nil,
		"Existing libvirt networks clusters and machines may name (comma-separated); empty or * allows any network but those the provider made for other namespaces.")
	fs.StringSliceVar(&o.NetworkCIDRs, "network-cidrs", slices.Clone(tenancy.DefaultNetworkCIDRs),
		"Ranges the networks the provider creates for LibvirtClusters may use (comma-separated CIDRs), spec.network.cidr and the range chosen when it is empty; * allows any range outside the reserved blocks, none only existing networks and bridges. A network's range becomes a route on its host.")
	fs.StringSliceVar(&o.PoolAddressCIDRs, "pool-address-cidrs", []string{tenancy.None},
		"Ranges the addresses Cluster API IPAM pools give machines and HAProxy VMs (network.addressesFromPools, loadBalancer.addressFromPool) may lie in (comma-separated CIDRs); none (the default) or empty refuses every pool address, * allows any. Whatever the ranges, an address the libvirt host, a DHCP range, a DHCP entry or lease, or another VM on the segment holds is refused.")
	fs.StringSliceVar(&o.IPAMPools, "ipam-pools", slices.Clone(tenancy.DefaultIPAMPools),
		"IPAM pools each namespace's machines and HAProxy VMs may take addresses from (comma-separated NAMESPACE=KIND/NAME or NAMESPACE=KIND.GROUP/NAME; NAMESPACE and NAME may be *); a cluster-wide pool such as GlobalInClusterIPPool is shared by every namespace granted it. none grants no pool.")
	fs.StringSliceVar(&o.HostDevices, "host-devices", nil,
		"PCI devices of the libvirt hosts that machines may take whole through VFIO (spec.hostDevices names the alias), comma-separated ALIAS=ADDRESS or ALIAS=ADDRESS/RESOURCE, as gpu0=0000:65:00.0/nvidia.com/gpu; RESOURCE is the extended resource a LibvirtMachineTemplate reports in its capacity. Empty or none allows no device.")
}
