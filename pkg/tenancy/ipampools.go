package tenancy

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// IPAMPoolGrant lets the machines and HAProxy VMs of a namespace take
// addresses from Cluster API IPAM pools of a kind (and name): one entry of
// the manager's --ipam-pools, NAMESPACE=KIND/NAME. A pool's addresses are
// whatever its maker says: a namespaced pool is its tenant's, and a
// cluster-wide one (GlobalInClusterIPPool) every namespace's that names
// it, so the operator says which namespaces may draw from which.
type IPAMPoolGrant struct {
	// Namespace is the namespace granted, or Any for every one.
	Namespace string
	// Kind is the pool's kind; Group, when set, its API group (an entry
	// KIND.GROUP/NAME), else any group.
	Kind, Group string
	// Name is the pool's name, or Any for every pool of the kind.
	Name string
}

// DefaultIPAMPools grant every namespace the in-cluster IPAM provider's
// namespaced pools, its own (a claim names a pool of its own namespace);
// a cluster-wide pool, shared by every namespace, only when the operator
// names it.
var DefaultIPAMPools = []string{"*=InClusterIPPool/*"}

// ParseIPAMPools parses the operator's --ipam-pools: None alone grants no
// pool (an empty, non-nil list), any other entry is NAMESPACE=KIND/NAME
// or NAMESPACE=KIND.GROUP/NAME, where NAMESPACE and NAME may be Any.
func ParseIPAMPools(list []string) ([]IPAMPoolGrant, error) {
	out := []IPAMPoolGrant{}
	for _, entry := range list {
		entry = strings.TrimSpace(entry)
		if entry == None || entry == "" {
			continue
		}
		ns, pool, ok := strings.Cut(entry, "=")
		kind, name, ok2 := strings.Cut(pool, "/")
		if !ok || !ok2 || ns == "" || kind == "" || name == "" {
			return nil, fmt.Errorf("IPAM pool grant %q: want NAMESPACE=KIND/NAME (NAMESPACE and NAME may be %s), as %s", entry, Any, DefaultIPAMPools[0])
		}
		if ns != Any {
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return nil, fmt.Errorf("IPAM pool grant %q: namespace %q: %s", entry, ns, strings.Join(errs, "; "))
			}
		}
		g := IPAMPoolGrant{Namespace: ns, Name: name}
		g.Kind, g.Group, _ = strings.Cut(kind, ".")
		out = append(out, g)
	}
	return out, nil
}

// grants tells whether g lets namespace draw from pool.
func (g IPAMPoolGrant) grants(namespace string, pool infrav1.IPPoolReference) bool {
	return (g.Namespace == Any || g.Namespace == namespace) && g.Kind == pool.Kind &&
		(g.Group == "" || g.Group == pool.APIGroup) && (g.Name == Any || g.Name == pool.Name)
}

// String is the grant as the flag writes it.
func (g IPAMPoolGrant) String() string {
	kind := g.Kind
	if g.Group != "" {
		kind += "." + g.Group
	}
	return g.Namespace + "=" + kind + "/" + g.Name
}

// CheckIPPool refuses an IPAM pool the operator did not grant namespace
// (IPAMPools; nil grants DefaultIPAMPools').
func (p Policy) CheckIPPool(namespace string, pool infrav1.IPPoolReference) error {
	grants := p.IPAMPools
	if grants == nil {
		grants, _ = ParseIPAMPools(DefaultIPAMPools) // it parses (TestParseIPAMPools)
	}
	for _, g := range grants {
		if g.grants(namespace, pool) {
			return nil
		}
	}
	if len(grants) == 0 {
		return errors.New("the operator grants no IPAM pool (the manager's --ipam-pools is none)")
	}
	names := make([]string, len(grants))
	for i, g := range grants {
		names[i] = g.String()
	}
	return fmt.Errorf("%s %s (group %s) is not granted to namespace %s: the manager's --ipam-pools grants %s", pool.Kind, pool.Name, pool.APIGroup, namespace, strings.Join(names, ", "))
}
