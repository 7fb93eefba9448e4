package plane

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Orphan is a libvirt object of the provider's that no object in the
// management cluster owns: its LibvirtMachine or LibvirtCluster is gone
// (released by a delete-for-move marker, deleted while the manager was
// down, or made by a management cluster that no longer exists).
type Orphan struct {
	virt.OwnedObject
	// Namespace is the namespace the object belongs to.
	Namespace string
}

// String names the orphan for a person.
func (o Orphan) String() string {
	if o.Kind == virt.OwnedVolume {
		return fmt.Sprintf("volume %s/%s (namespace %s)", o.Pool, o.Name, o.Namespace)
	}
	return fmt.Sprintf("%s %s (namespace %s)", o.Kind, o.Name, o.Namespace)
}

// FindOrphans lists what host holds for objects c does not have. The
// namespaces s records as moved away are left out: what libvirt holds of
// them is another management cluster's. Base images, shared by design,
// are never orphans.
func FindOrphans(ctx context.Context, c client.Reader, host virt.Host, s Scope) ([]Orphan, error) {
	owned, err := host.ListOwned(ctx)
	if err != nil {
		return nil, err
	}
	known, err := knownDomains(ctx, c)
	if err != nil {
		return nil, err
	}
	var out []Orphan
	for _, o := range owned {
		ns, ok := namespaceOf(o)
		if !ok || s.handedOver(ns) || known.owns(o) {
			continue
		}
		out = append(out, Orphan{OwnedObject: o, Namespace: ns})
	}
	return out, nil
}

// RemoveOrphans deletes orphans, domains before the volumes and networks
// they use.
func RemoveOrphans(ctx context.Context, host virt.Host, orphans []Orphan) error {
	var errs []error
	for _, kind := range []virt.OwnedKind{virt.OwnedDomain, virt.OwnedVolume, virt.OwnedNetwork} {
		for _, o := range orphans {
			if o.Kind != kind {
				continue
			}
			var err error
			switch kind {
			case virt.OwnedDomain:
				err = host.DeleteDomain(ctx, o.Name)
			case virt.OwnedVolume:
				err = host.DeleteVolume(ctx, o.Pool, o.Name)
			case virt.OwnedNetwork:
				err = host.DeleteNetwork(ctx, o.Name)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", o, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing orphans: %v", errs)
	}
	return nil
}

// namespaceOf is the namespace o belongs to: its owner's, or the one its
// name derives from; false for objects of no namespace (base images).
func namespaceOf(o virt.OwnedObject) (string, bool) {
	if o.Owner != nil {
		return o.Owner.Namespace, o.Owner.Namespace != ""
	}
	if strings.HasPrefix(o.Name, imageVolumePrefix) {
		return "", false
	}
	return naming.NameNamespace(o.Name)
}

// domainSet is the domains and networks the management cluster's
// objects own, by name.
type domainSet struct {
	domains, networks []string
}

func knownDomains(ctx context.Context, c client.Reader) (domainSet, error) {
	var set domainSet
	var machines infrav1.LibvirtMachineList
	if err := c.List(ctx, &machines); err != nil {
		return set, fmt.Errorf("listing LibvirtMachines: %w", err)
	}
	for _, m := range machines.Items {
		set.domains = append(set.domains, naming.DomainName(m.Namespace, m.Name))
	}
	var clusters infrav1.LibvirtClusterList
	if err := c.List(ctx, &clusters); err != nil {
		return set, fmt.Errorf("listing LibvirtClusters: %w", err)
	}
	for _, lc := range clusters.Items {
		set.domains = append(set.domains, naming.LoadBalancerDomainName(lc.Namespace, lc.Name))
		set.networks = append(set.networks, naming.ClusterNetworkName(lc.Namespace, lc.Name))
	}
	return set, nil
}

// owns tells whether o is a known domain, one of its volumes, or a known
// network.
func (s domainSet) owns(o virt.OwnedObject) bool {
	if o.Kind == virt.OwnedNetwork {
		return slices.Contains(s.networks, o.Name)
	}
	return slices.ContainsFunc(s.domains, func(d string) bool { return quota.OfDomain(d, o) })
}
