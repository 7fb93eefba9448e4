// Package tenancy decides which libvirt objects a namespace may name.
//
// A management cluster is shared, and each namespace is a trust boundary
// (Cluster API's multi-tenancy): what one namespace's objects name must
// never reach another namespace's disks, seeds or networks, and the
// provider, which talks to a root libvirtd, writes only where the operator
// allows. The rules are pure functions of the names involved and of the
// operator's Policy, so that the webhooks (which can be absent or
// bypassed) and the controllers (before they create anything) apply the
// very same ones.
//
// By job: checks.go, everything a machine or a cluster names and asks
// for checked at once (CheckMachine, CheckCluster), every refusal typed so
// that the webhooks turn it into a field error and the controllers into
// a condition; tenancy.go, the pools, images, networks and bridges a
// tenant may name; limits.go, the sizes the operator bounds and their
// arithmetic (pkg/quota counts what a namespace holds with it);
// libvirturi.go, the libvirt hosts a failure domain may name; cidrs.go,
// the subnets a cluster network may take; hostdevices.go, the PCI devices
// a machine may take.
package tenancy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// DefaultPoolDirs is where pools may be created unless the operator says
// otherwise: libvirt's own storage tree, where the default pool lives.
var DefaultPoolDirs = []string{"/var/lib/libvirt"}

// DefaultImagePools are the image pools unless the operator says
// otherwise: the default pool, into which the documentation has users
// upload their images.
var DefaultImagePools = []string{infrav1.DefaultStoragePoolName}

// systemTrees are directories that no pool may be, be inside, or contain,
// whatever the operator lists: the host's system, kernel interfaces and
// libvirt's own state (domain state, DHCP host files, secrets).
var systemTrees = []string{
	"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run", "/sbin",
	"/sys", "/usr", "/var/lock", "/var/log", "/var/run",
	"/var/lib/libvirt/boot", "/var/lib/libvirt/ch", "/var/lib/libvirt/dnsmasq", "/var/lib/libvirt/libxl",
	"/var/lib/libvirt/lxc", "/var/lib/libvirt/network", "/var/lib/libvirt/qemu", "/var/lib/libvirt/sanlock",
	"/var/lib/libvirt/secrets", "/var/lib/libvirt/swtpm",
}

// sharedDirs hold other software's data side by side: a pool may be
// below them but never be one of them.
var sharedDirs = []string{
	"/", "/home", "/media", "/mnt", "/opt", "/srv", "/tmp", "/var", "/var/cache", "/var/lib", "/var/lib/libvirt",
	"/var/tmp",
}

// Any in a list of names allows every name, like an empty list; it is how
// the release manifest's variables say "any" (clusterctl takes an empty
// default for a missing value). None alone allows no name: the release
// manifest's default for host bridges and existing networks, which are
// shared segments an operator opens deliberately.
const (
	Any  = "*"
	None = "none"
)

// Policy is what the operator lets tenants name; the manager's flags set
// it (pkg/manager). Empty lists of names (or Any) mean "any name", within
// the rules that always hold.
type Policy struct {
	// PoolDirs are the directories below which a LibvirtCluster may have
	// the provider create its storage pool.
	PoolDirs []string
	// Pools, when not empty, are the only storage pools a LibvirtCluster
	// or LibvirtMachine may use.
	Pools []string
	// ImagePools are the pools whose volumes are base images anyone may
	// name in image.volume (besides images the provider imported).
	ImagePools []string
	// Bridges, when not empty, are the only host bridges a cluster or
	// machine may be plugged into.
	Bridges []string
	// Networks, when not empty, are the only existing libvirt networks a
	// cluster or machine may name (its own cluster's managed network
	// aside).
	Networks []string
	// ImageFileDirs are the directories on the manager's host whose files
	// image URLs may name (file://); none refuses file:// images.
	ImageFileDirs []string
	// Machine bounds one machine; Namespace bounds the sum of a
	// namespace's machines. Zero fields set no bound.
	Machine, Namespace Limits
	// TrafficFilter is the libvirt nwfilter bound to the NIC of every
	// machine on a host bridge or on a libvirt network the provider did
	// not make for its cluster; empty for none.
	TrafficFilter string
	// ManagerURI is the manager's own libvirt host (--libvirt-uri), which
	// failure domains may always name.
	ManagerURI string
	// LibvirtURIs are the other libvirt URIs failure domains may name;
	// empty (or None) allows none, Any allows every URI without query
	// parameters.
	// Unlike the lists above, empty is closed: a URI is a connection the
	// manager opens with its own identity, so the operator opens it.
	LibvirtURIs []string
	// HostDenyNets are the addresses a URI that only Any admits may not
	// lead to (the manager's --image-url-deny-cidrs): checked here when
	// the URI's host is an address, by pkg/hosts on every connect when it
	// is a name.
	HostDenyNets []netip.Prefix
	// NetworkCIDRs are the ranges the networks the provider creates may
	// use (the manager's --network-cidrs); nil allows any range outside
	// the reserved blocks (netalloc.ValidatePrefix).
	NetworkCIDRs []netip.Prefix
	// PoolAddressCIDRs are the ranges the addresses IPAM pools hand
	// machines may lie in (the manager's --pool-address-cidrs); nil allows
	// any, empty none.
	PoolAddressCIDRs []netip.Prefix
	// IPAMPools are the IPAM pools each namespace may take addresses
	// from (the manager's --ipam-pools); nil grants DefaultIPAMPools,
	// empty none.
	IPAMPools []IPAMPoolGrant
	// HostDevices are the PCI devices machines may take whole, by alias
	// (the manager's --host-devices); none when empty.
	HostDevices []HostDevice
}

// DefaultPolicy is the policy of the manager's flag defaults.
func DefaultPolicy() Policy {
	cidrs, _ := ParseNetworkCIDRs(DefaultNetworkCIDRs) // they parse (TestParseNetworkCIDRs)
	return Policy{PoolDirs: slices.Clone(DefaultPoolDirs), ImagePools: slices.Clone(DefaultImagePools), NetworkCIDRs: cidrs}
}

// Validate checks the operator's settings: every pool directory an
// absolute, clean path that is not a system directory nor /.
func (p Policy) Validate() error {
	var errs []error
	if len(p.PoolDirs) == 0 {
		errs = append(errs, errors.New("no storage pool directory: list at least one"))
	}
	for _, d := range p.PoolDirs {
		if err := checkCleanAbs(d); err != nil {
			errs = append(errs, fmt.Errorf("storage pool directory %q %w", d, err))
			continue
		}
		if d == "/" {
			errs = append(errs, errors.New("storage pool directory / would let pools be made anywhere: name the directories"))
			continue
		}
		if t := systemTree(d); t != "" {
			errs = append(errs, fmt.Errorf("storage pool directory %s is in the system directory %s", d, t))
		}
	}
	for _, d := range p.ImageFileDirs {
		if err := checkCleanAbs(d); err != nil {
			errs = append(errs, fmt.Errorf("image file directory %q %w", d, err))
		} else if d == "/" {
			errs = append(errs, errors.New("image file directory / would let image URLs read any file of the manager's host: name the directories"))
		}
	}
	return errors.Join(errs...)
}

func checkCleanAbs(path string) error {
	switch {
	case !filepath.IsAbs(path):
		return errors.New("must be an absolute path")
	case slices.Contains(strings.Split(path, "/"), ".."):
		return errors.New("must not contain ..")
	case filepath.Clean(path) != path:
		return fmt.Errorf("must be a clean path: %s", filepath.Clean(path))
	}
	return nil
}

// systemTree returns the system directory dir is or lies in, or "".
func systemTree(dir string) string {
	for _, t := range systemTrees {
		if within(dir, t) {
			return t
		}
	}
	return ""
}

// within tells whether dir is root or lies below it; both are clean.
func within(dir, root string) bool {
	return dir == root || strings.HasPrefix(dir, strings.TrimSuffix(root, "/")+"/")
}

// CheckPoolPath refuses a storage pool directory the provider may not
// create a pool at: anything but a clean absolute path strictly below one
// of PoolDirs, and, whatever those are, / or the system directories and
// anything in them. The check is lexical: the libvirt host may be remote,
// so symbolic links inside PoolDirs are the operator's to avoid.
func (p Policy) CheckPoolPath(path string) error {
	if err := checkCleanAbs(path); err != nil {
		return err
	}
	if t := systemTree(path); t != "" {
		return fmt.Errorf("is in the system directory %s: pools never go there", t)
	}
	for _, t := range systemTrees {
		if within(t, path) {
			return fmt.Errorf("contains the system directory %s: pools never go there", t)
		}
	}
	if slices.Contains(sharedDirs, path) {
		return fmt.Errorf("is %s itself, which other software shares: use a directory of its own below it", path)
	}
	for _, d := range p.PoolDirs {
		if d != path && within(path, d) {
			return nil
		}
	}
	return fmt.Errorf("must be a directory below one of %s (the manager's --storage-pool-dirs)", strings.Join(p.PoolDirs, ", "))
}

// CheckPoolName refuses a pool the operator did not list, when they did.
func (p Policy) CheckPoolName(name string) error {
	if allows(p.Pools, name) {
		return nil
	}
	return fmt.Errorf("must be one of the storage pools %s (the manager's --storage-pools)", strings.Join(p.Pools, ", "))
}

// CheckPool refuses a pool spec (a path only when the provider would
// create the pool) with the field at fault, "name" or "path".
func (p Policy) CheckPool(name, path string) (field string, err error) {
	if err := p.CheckPoolName(name); err != nil {
		return "name", err
	}
	if path == "" {
		return "", nil
	}
	if err := p.CheckPoolPath(path); err != nil {
		return "path", err
	}
	return "", nil
}

// IsImagePool tells whether the operator declared pool an image pool.
func (p Policy) IsImagePool(pool string) bool { return slices.Contains(p.ImagePools, pool) }

// CheckImageVolume refuses an image volume that is not a base image, with
// the field at fault ("name" or "pool"). Base images are those the provider
// imported (content-addressed names, in any pool), the default HAProxy
// image, and any other volume of an image pool; never a volume the
// provider makes for one machine or load balancer, of any namespace, in
// whatever pool: its root disk holds that machine's data and its seed its
// bootstrap secrets. defaultPool is the pool an image without one is in:
// the cluster's, or "" when unknown (a template), which leaves that
// pool's check to the controller.
func (p Policy) CheckImageVolume(ref infrav1.VolumeReference, defaultPool string) (field string, err error) {
	switch {
	case naming.IsManagedVolumeName(ref.Name):
		return "name", errors.New("names a volume the provider manages for a machine or load balancer (a root disk, a seed ISO or an import under way): only base images may back a disk")
	case naming.IsImageVolumeName(ref.Name), ref.Name == infrav1.DefaultLoadBalancerImageVolume:
		return "", nil
	}
	pool := ref.Pool
	field = "pool"
	if pool == "" {
		pool, field = defaultPool, "name"
	}
	if pool == "" || p.IsImagePool(pool) {
		return "", nil
	}
	return field, fmt.Errorf("must name a base image: an image the provider imported from a url (%s…) or a volume of an image pool (%s; the manager's --image-pools), and pool %s is none",
		naming.ImageVolumeName(""), listOrNone(p.ImagePools), pool)
}

// CheckImageURL refuses a file:// URL outside ImageFileDirs, judged by
// its path alone (the import resolves symlinks inside the directory, on
// the manager's host). Other URLs are the import's to check: where they
// lead is known only when they are fetched.
func (p Policy) CheckImageURL(raw string) error {
	path, ok := strings.CutPrefix(raw, "file://")
	if !ok {
		return nil
	}
	if u, err := url.Parse(raw); err == nil {
		path = u.Path
	}
	if len(p.ImageFileDirs) == 0 {
		return errors.New("file:// images are not allowed: the operator allows no directory (the manager's --image-file-dirs); serve the image over http(s) or import it into an image pool")
	}
	for _, d := range p.ImageFileDirs {
		if within(filepath.Clean(path), d) && filepath.Clean(path) != d {
			return nil
		}
	}
	return fmt.Errorf("must name a file below %s (the manager's --image-file-dirs)", strings.Join(p.ImageFileDirs, ", "))
}

// CheckNetwork refuses a libvirt network that the provider created for a
// cluster of another namespace (its name derives from that namespace:
// naming.ClusterNetworkName), and, when the operator listed networks, any
// network neither listed nor of namespace's own clusters.
func (p Policy) CheckNetwork(namespace, name string) error {
	if ns, ok := naming.NameNamespace(name); ok {
		if ns != namespace {
			return fmt.Errorf("is the network of a cluster in namespace %s: a cluster's network is its namespace's alone", ns)
		}
		return nil
	}
	if allows(p.Networks, name) {
		return nil
	}
	if denyAll(p.Networks) {
		return errors.New("names an existing libvirt network, and the operator allows none (the manager's --libvirt-networks): use the network the provider makes for the cluster")
	}
	return fmt.Errorf("must be one of the libvirt networks %s (the manager's --libvirt-networks) or a network the provider made for a cluster of this namespace",
		strings.Join(p.Networks, ", "))
}

// CheckStaticAddress refuses a VM of ours holding an address on a host
// bridge that it did not get from the LAN's DHCP server (the HAProxy VM's
// endpoint) while trafficFilter guards the bridge's NICs: the filter lets
// a guest use only the address it was leased, and an address a tenant
// chose could be another machine's.
func CheckStaticAddress(trafficFilter string) error {
	if trafficFilter == "" {
		return nil
	}
	return fmt.Errorf("on a host bridge the HAProxy VM holds the endpoint as a static address, which the manager's traffic filter %s drops as spoofing (a guest may use only the address the LAN's DHCP server gave it): "+
		"on a LAN whose guests are all trusted the operator can turn the filter off (--traffic-filter=none); otherwise use loadBalancer.type None with an external load balancer, or a libvirt network", trafficFilter)
}

// CheckBridge refuses the bridge of a network the provider created (it
// would plug a machine into another cluster's network behind its back)
// and, when the operator listed bridges, any bridge not listed.
func (p Policy) CheckBridge(bridge string) error {
	if netalloc.IsBridgeName(bridge) {
		return errors.New("is the bridge of a network the provider made for a cluster: name that cluster's network, if it is this namespace's")
	}
	if allows(p.Bridges, bridge) {
		return nil
	}
	if denyAll(p.Bridges) {
		return errors.New("names a host bridge, and the operator allows none (the manager's --host-bridges)")
	}
	return fmt.Errorf("must be one of the host bridges %s (the manager's --host-bridges)", strings.Join(p.Bridges, ", "))
}

// allows tells whether a list of names the operator may leave open lets
// name through.
func allows(list []string, name string) bool {
	if denyAll(list) {
		return false
	}
	return len(list) == 0 || slices.Contains(list, Any) || slices.Contains(list, name)
}

// denyAll tells whether list is None alone.
func denyAll(list []string) bool { return len(list) == 1 && list[0] == None }

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
