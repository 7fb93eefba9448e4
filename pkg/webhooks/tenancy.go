package webhooks

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// references refuses what an object names outside what its namespace may
// use (pkg/tenancy): another namespace's disks, seeds and networks, pools
// and bridges the operator did not allow. The controllers apply the same
// rules before they create anything, for objects the webhook never saw.
type references struct {
	// policy is the operator's; nil checks nothing (tests of other rules).
	policy *tenancy.Policy
}

// annotationsPath and templateAnnotationsPath are where an object's
// annotations, and those a template gives the objects made from it, are.
var (
	annotationsPath         = field.NewPath("metadata", "annotations")
	templateAnnotationsPath = field.NewPath("spec", "template", "metadata", "annotations")
)

// cluster checks a LibvirtCluster spec at path in namespace, and the
// annotations (at annPath) the objects made from it carry.
func (r references) cluster(namespace string, spec *infrav1.LibvirtClusterSpec, annotations map[string]string, path, annPath *field.Path) field.ErrorList {
	if r.policy == nil {
		return nil
	}
	p := r.policy
	var errs field.ErrorList
	pool := scope.ClusterPool(&infrav1.LibvirtCluster{Spec: *spec})
	if f, err := p.CheckPool(pool.Name, pool.Path); err != nil {
		errs = append(errs, field.Invalid(path.Child("storagePool", f), map[string]string{"name": pool.Name, "path": pool.Path}[f], err.Error()))
	}
	errs = append(errs, r.network(namespace, spec.Network.Name, spec.Network.Bridge, path.Child("network"))...)
	errs = append(errs, r.networkCIDR(spec.Network, path.Child("network"))...)
	if img := spec.LoadBalancer.Image; img != nil && img.Volume != nil {
		errs = append(errs, r.image(*img.Volume, pool.Name, path.Child("loadBalancer", "image", "volume"))...)
	}
	if img := spec.LoadBalancer.Image; img != nil {
		errs = append(errs, r.imageURL(img.URL, path.Child("loadBalancer", "image", "url"))...)
	}
	errs = append(errs, r.hosts(spec, path)...)
	errs = append(errs, r.sizes(tenancy.LoadBalancerUsage(spec), path.Child("loadBalancer"))...)
	if pool := spec.LoadBalancer.AddressFromPool; pool != nil {
		if err := p.CheckIPPool(namespace, *pool); err != nil {
			errs = append(errs, field.Forbidden(path.Child("loadBalancer", "addressFromPool"), err.Error()))
		}
	}
	// An address from a pool is the VM's only one, which the traffic
	// filter is pinned to; a typed one would be a second, unfiltered.
	if spec.LoadBalancer.Type == infrav1.LoadBalancerHAProxy && spec.Network.Bridge != "" && spec.LoadBalancer.AddressFromPool == nil {
		if err := tenancy.CheckStaticAddress(p.TrafficFilter); err != nil {
			errs = append(errs, field.Forbidden(path.Child("loadBalancer", "type"), err.Error()))
		}
	}
	return append(errs, r.annotations(namespace, annotations, annPath)...)
}

// hosts refuses libvirt URIs the operator did not allow, and a cluster
// over several hosts on a network that lives on one: a NAT network (or
// any libvirt network) is one host's, only a host bridge spans hosts.
func (r references) hosts(spec *infrav1.LibvirtClusterSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, fd := range spec.FailureDomains {
		if _, err := tenancy.ParseLibvirtURI(fd.URI); fd.URI != "" && err != nil {
			continue // validateFailureDomains said so
		}
		if err := r.policy.CheckLibvirtURI(fd.URI, fd.CredentialsRef != nil); err != nil {
			errs = append(errs, field.Invalid(path.Child("failureDomains").Index(i).Child("uri"), fd.URI, err.Error()))
		}
	}
	if n := hosts.CountHosts(&infrav1.LibvirtCluster{Spec: *spec}, r.policy.ManagerURI); n > 1 && spec.Network.Bridge == "" {
		errs = append(errs, field.Invalid(path.Child("network"), spec.Network,
			fmt.Sprintf("the failure domains name %d libvirt hosts: machines on several hosts share a LAN only through a host bridge on each (network.bridge); a NAT or libvirt network lives on one host", n)))
	}
	return errs
}

// machine checks a LibvirtMachine spec at path in namespace whose images
// without a pool are in pool ("" when unknown), and the annotations (at
// annPath) the machines made from it carry.
func (r references) machine(namespace string, spec *infrav1.LibvirtMachineSpec, pool string, annotations map[string]string, path, annPath *field.Path) field.ErrorList {
	if r.policy == nil {
		return nil
	}
	var errs field.ErrorList
	if spec.Image.Volume != nil {
		errs = append(errs, r.image(*spec.Image.Volume, pool, path.Child("image", "volume"))...)
	}
	errs = append(errs, r.imageURL(spec.Image.URL, path.Child("image", "url"))...)
	errs = append(errs, r.sizes(tenancy.MachineUsage(spec), path)...)
	for i, d := range spec.DataDisks {
		if d.Pool == "" {
			continue // the root disk's pool, checked with the cluster
		}
		if err := r.policy.CheckPoolName(d.Pool); err != nil {
			errs = append(errs, field.Invalid(path.Child("dataDisks").Index(i).Child("pool"), d.Pool, err.Error()))
		}
	}
	for i, d := range spec.HostDevices {
		if _, err := r.policy.HostDevice(d.Name); err != nil {
			errs = append(errs, field.Invalid(path.Child("hostDevices").Index(i).Child("name"), d.Name, err.Error()))
		}
	}
	if n := spec.Network; n != nil {
		errs = append(errs, r.network(namespace, n.Name, n.Bridge, path.Child("network"))...)
		for i, pool := range n.AddressesFromPools {
			if err := r.policy.CheckIPPool(namespace, pool); err != nil {
				errs = append(errs, field.Forbidden(path.Child("network", "addressesFromPools").Index(i), err.Error()))
			}
		}
	}
	return append(errs, r.annotations(namespace, annotations, annPath)...)
}

// sizes refuses a VM (a machine, or the HAProxy VM at path) larger than
// the operator allows one VM to be.
func (r references) sizes(u tenancy.Usage, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	exceeded := r.policy.Machine.Exceeded(u, "--max-machine-")
	for _, f := range slices.Sorted(maps.Keys(exceeded)) {
		errs = append(errs, field.Forbidden(path.Child(f), exceeded[f]))
	}
	return errs
}

func (r references) image(ref infrav1.VolumeReference, pool string, path *field.Path) field.ErrorList {
	if strings.HasSuffix(ref.Name, partialVolumeSuffix) {
		return nil // validateImageSource says why
	}
	f, err := r.policy.CheckImageVolume(ref, pool)
	if err == nil {
		return nil
	}
	value := ref.Name
	if f == "pool" {
		value = ref.Pool
	}
	return field.ErrorList{field.Invalid(path.Child(f), value, err.Error())}
}

func (r references) imageURL(raw string, path *field.Path) field.ErrorList {
	if err := r.policy.CheckImageURL(raw); err != nil {
		return field.ErrorList{field.Forbidden(path, err.Error())}
	}
	return nil
}

func (r references) network(namespace, name, bridge string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if name != "" {
		if err := r.policy.CheckNetwork(namespace, name); err != nil {
			errs = append(errs, field.Invalid(path.Child("name"), name, err.Error()))
		}
	}
	if bridge != "" {
		if err := r.policy.CheckBridge(bridge); err != nil {
			errs = append(errs, field.Invalid(path.Child("bridge"), bridge, err.Error()))
		}
	}
	return errs
}

// networkCIDR refuses the range of the network the provider would create
// that the operator does not allow.
func (r references) networkCIDR(n infrav1.ClusterNetwork, path *field.Path) field.ErrorList {
	if err := r.policy.CheckClusterNetworkCIDR(n); err != nil {
		return field.ErrorList{field.Invalid(path.Child("cidr"), n.CIDR, err.Error())}
	}
	return nil
}

// annotations checks the placement the provider records on its objects
// (scope.PoolAnnotation, scope.NetworkAnnotation): it is honoured before
// the spec, so a value written by hand is a reference like any other.
func (r references) annotations(namespace string, annotations map[string]string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if pool := annotations[scope.PoolAnnotation]; pool != "" {
		if err := r.policy.CheckPoolName(pool); err != nil {
			errs = append(errs, field.Invalid(path.Key(scope.PoolAnnotation), pool, err.Error()))
		}
	}
	if v := annotations[scope.NetworkAnnotation]; v != "" {
		n := scope.ParseNetworkRef(v)
		var err error
		switch {
		case n.Name != "":
			err = r.policy.CheckNetwork(namespace, n.Name)
		case n.Bridge != "":
			err = r.policy.CheckBridge(n.Bridge)
		}
		if err != nil {
			errs = append(errs, field.Invalid(path.Key(scope.NetworkAnnotation), v, err.Error()))
		}
	}
	return errs
}

// placementUnchanged refuses an update that changes or removes a placement
// or identity annotation the provider recorded: deletion looks for the
// object's volumes, network and reservation where they say, so an edit
// before a delete would leave the root disk, the seed with its bootstrap
// data or a DHCP entry behind. An object `clusterctl move` is taking away
// is exempt: clusterctl replaces all its annotations with the
// delete-for-move marker (a JSON patch adding /metadata/annotations) before
// it deletes it, and the provider then only releases it (nothing looks for
// its placement; the libvirt objects are the target cluster's).
func placementUnchanged(oldA, newA map[string]string) field.ErrorList {
	if _, moving := newA[clusterctlv1.DeleteForMoveAnnotation]; moving {
		return nil
	}
	var errs field.ErrorList
	for _, key := range []string{scope.PoolAnnotation, scope.NetworkAnnotation, scope.MACAnnotation,
		scope.LoadBalancerUUIDAnnotation, scope.LoadBalancerMACAnnotation} {
		if old := oldA[key]; old != "" && newA[key] != old {
			errs = append(errs, field.Forbidden(annotationsPath.Key(key),
				fmt.Sprintf("is the placement the provider recorded (%q) and cannot change: deletion finds the object's volumes and network by it", old)))
		}
	}
	return errs
}

// ratchet drops the errors of an update that old had as well (same field,
// same value): a reference refused only since the operator tightened the
// policy must not block the updates that finish or delete the object
// (the provider's own patches, finalizer removal).
func ratchet(errs, old field.ErrorList) field.ErrorList {
	var out field.ErrorList
	for _, e := range errs {
		seen := false
		for _, o := range old {
			if o.Field == e.Field && o.BadValue == e.BadValue {
				seen = true
				break
			}
		}
		if !seen {
			out = append(out, e)
		}
	}
	return out
}
