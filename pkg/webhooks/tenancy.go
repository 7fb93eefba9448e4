package webhooks

import (
	"fmt"
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
// annotations (at annPath) the objects made from it carry: the policy's
// refusals (tenancy.Policy.CheckCluster, which the controller applies
// too), then what only admission checks.
func (r references) cluster(namespace string, spec *infrav1.LibvirtClusterSpec, annotations map[string]string, path, annPath *field.Path) field.ErrorList {
	if r.policy == nil {
		return nil
	}
	p := r.policy
	pool := scope.ClusterPool(&infrav1.LibvirtCluster{Spec: *spec})
	lb := &tenancy.LoadBalancerRefs{Usage: tenancy.LoadBalancerUsage(spec), AddressPool: spec.LoadBalancer.AddressFromPool}
	if img := spec.LoadBalancer.Image; img != nil {
		lb.Image = image(*img, pool.Name)
	}
	refusals := p.CheckCluster(namespace, tenancy.ClusterRefs{
		Pool: tenancy.Pool{Name: pool.Name, Path: pool.Path}, Network: spec.Network, LoadBalancer: lb, Recorded: recorded(annotations),
	})
	lbPath := path.Child("loadBalancer")
	errs := fieldErrors(refusals, func(rf tenancy.Refusal) *field.Path {
		switch rf.Part {
		case tenancy.PartPool:
			return path.Child("storagePool", rf.Field)
		case tenancy.PartNetwork:
			return path.Child("network", rf.Field)
		case tenancy.PartNetworkCIDR:
			return path.Child("network", "cidr")
		case tenancy.PartImageVolume:
			return lbPath.Child("image", "volume", rf.Field)
		case tenancy.PartImageURL:
			return lbPath.Child("image", "url")
		case tenancy.PartSize:
			return lbPath.Child(rf.Field)
		case tenancy.PartIPAMPool:
			return lbPath.Child("addressFromPool")
		}
		return annotationPath(rf, annPath)
	})
	errs = append(errs, r.hosts(spec, path)...)
	// An address from a pool is the VM's only one, which the traffic
	// filter is pinned to; a typed one would be a second, unfiltered.
	if spec.LoadBalancer.Type == infrav1.LoadBalancerHAProxy && spec.Network.Bridge != "" && spec.LoadBalancer.AddressFromPool == nil {
		if err := tenancy.CheckStaticAddress(p.TrafficFilter); err != nil {
			errs = append(errs, field.Forbidden(lbPath.Child("type"), err.Error()))
		}
	}
	return errs
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
// annPath) the machines made from it carry (tenancy.Policy.CheckMachine,
// which the controller applies too). The machine's own pool is the
// cluster's, checked with it, or the recorded one.
func (r references) machine(namespace string, spec *infrav1.LibvirtMachineSpec, pool string, annotations map[string]string, path, annPath *field.Path) field.ErrorList {
	if r.policy == nil {
		return nil
	}
	refs := tenancy.MachineRefsOf(spec, pool)
	refs.Image, refs.Recorded = image(spec.Image, pool), recorded(annotations)
	return fieldErrors(r.policy.CheckMachine(namespace, refs), func(rf tenancy.Refusal) *field.Path {
		switch rf.Part {
		case tenancy.PartImageVolume:
			return path.Child("image", "volume", rf.Field)
		case tenancy.PartImageURL:
			return path.Child("image", "url")
		case tenancy.PartSize:
			return path.Child(rf.Field)
		case tenancy.PartDataDiskPool:
			return path.Child("dataDisks").Index(rf.Index).Child("pool")
		case tenancy.PartHostDevice:
			return path.Child("hostDevices").Index(rf.Index).Child("name")
		case tenancy.PartNetwork:
			return path.Child("network", rf.Field)
		case tenancy.PartIPAMPool:
			return path.Child("network", "addressesFromPools").Index(rf.Index)
		}
		return annotationPath(rf, annPath)
	})
}

// image is what the policy checks of src, whose volume without a pool is
// in pool. A volume still being imported is validateImageSource's to
// refuse, with its own reason.
func image(src infrav1.ImageSource, pool string) tenancy.Image {
	img := tenancy.Image{Volume: src.Volume, DefaultPool: pool, URL: src.URL}
	if img.Volume != nil && strings.HasSuffix(img.Volume.Name, partialVolumeSuffix) {
		img.Volume = nil
	}
	return img
}

// recorded is the placement the provider records on its objects
// (scope.PoolAnnotation, scope.NetworkAnnotation), read from annotations.
func recorded(annotations map[string]string) tenancy.Recorded {
	r := tenancy.Recorded{Pool: annotations[scope.PoolAnnotation], Network: annotations[scope.NetworkAnnotation]}
	if r.Network != "" {
		n := scope.ParseNetworkRef(r.Network)
		r.NetworkRef = tenancy.Network{Name: n.Name, Bridge: n.Bridge}
	}
	return r
}

// annotationPath is where a refused recorded placement is, below annPath.
func annotationPath(rf tenancy.Refusal, annPath *field.Path) *field.Path {
	if rf.Part == tenancy.PartRecordedNetwork {
		return annPath.Key(scope.NetworkAnnotation)
	}
	return annPath.Key(scope.PoolAnnotation)
}

// fieldErrors turns refusals into errors at the paths at gives them:
// Forbidden, which shows no value, for an image URL (it may carry
// credentials), a size and an IPAM pool (the message names them), Invalid
// with the value for the rest.
func fieldErrors(refusals []tenancy.Refusal, at func(tenancy.Refusal) *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, rf := range refusals {
		switch rf.Part {
		case tenancy.PartImageURL, tenancy.PartSize, tenancy.PartIPAMPool:
			errs = append(errs, field.Forbidden(at(rf), rf.Message))
		default:
			errs = append(errs, field.Invalid(at(rf), rf.Value, rf.Message))
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
