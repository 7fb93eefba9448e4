package tenancy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// DefaultNetworkCIDRs are the ranges the networks the provider creates may
// use unless the operator says otherwise: the private ranges of RFC 1918.
// A network's range becomes a connected route on its host, into the
// cluster's bridge: a public range there would take it away from the
// host's own traffic (its DNS servers, registries, other libvirt hosts)
// and hand that traffic to the tenant's VMs.
var DefaultNetworkCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}

// CheckNetworkCIDR refuses a range, for a network the provider creates,
// that lies outside every one of NetworkCIDRs (nil NetworkCIDRs allow
// any); the zero cidr, for a range the provider chooses, only when
// NetworkCIDRs allow none. The reserved blocks are
// netalloc.ValidatePrefix's to refuse, and overlaps with the host's
// routes and networks the network service's.
func (p Policy) CheckNetworkCIDR(cidr netip.Prefix) error {
	switch {
	case p.NetworkCIDRs == nil:
		return nil
	case len(p.NetworkCIDRs) == 0:
		return errors.New("the operator allows no range for the networks the provider creates (the manager's --network-cidrs is none): name an existing libvirt network or host bridge")
	case !cidr.IsValid(), netalloc.Inside(cidr, p.NetworkCIDRs):
		// The provider chooses among netalloc.CandidatesWithin(NetworkCIDRs).
		return nil
	}
	names := make([]string, len(p.NetworkCIDRs))
	for i, r := range p.NetworkCIDRs {
		names[i] = r.String()
	}
	return fmt.Errorf("is not within %s (the manager's --network-cidrs): a network's range becomes a route on its libvirt host, which would take that range from the host and everyone else on it",
		strings.Join(names, ", "))
}

// CheckClusterNetworkCIDR applies CheckNetworkCIDR to the network the
// provider would create for n: none when n names a network or bridge. A
// CIDR that does not parse is not this check's to report (the CRD, the
// webhook and the network service refuse it).
func (p Policy) CheckClusterNetworkCIDR(n infrav1.ClusterNetwork) error {
	if n.Name != "" || n.Bridge != "" {
		return nil
	}
	var cidr netip.Prefix
	if n.CIDR != "" {
		var err error
		if cidr, err = netip.ParsePrefix(n.CIDR); err != nil {
			return nil
		}
	}
	return p.CheckNetworkCIDR(cidr)
}

// CheckPoolAddress refuses an address an IPAM pool handed a machine that
// lies outside every one of PoolAddressCIDRs (none when empty; the Any
// flag value makes it nil, which allows any): pools are objects of the
// tenant's namespace or a provider's, and the operator bounds what
// addresses their machines may hold on shared segments.
func (p Policy) CheckPoolAddress(a netip.Addr) error {
	if p.PoolAddressCIDRs == nil {
		return nil
	}
	for _, r := range p.PoolAddressCIDRs {
		if r.Contains(a) {
			return nil
		}
	}
	if len(p.PoolAddressCIDRs) == 0 {
		return errors.New("the operator allows no address from IPAM pools (the manager's --pool-address-cidrs is none)")
	}
	names := make([]string, len(p.PoolAddressCIDRs))
	for i, r := range p.PoolAddressCIDRs {
		names[i] = r.String()
	}
	return fmt.Errorf("%s is not within %s (the manager's --pool-address-cidrs)", a, strings.Join(names, ", "))
}

// ParseNetworkCIDRs parses the operator's --network-cidrs: Any alone (or
// among others) allows every range (nil), None alone none (an empty,
// non-nil list), any other entry is a CIDR.
func ParseNetworkCIDRs(list []string) ([]netip.Prefix, error) {
	if len(list) == 0 {
		return nil, fmt.Errorf("no network range: list CIDRs, %s for any range or %s for none", Any, None)
	}
	out := []netip.Prefix{}
	for _, s := range list {
		s = strings.TrimSpace(s)
		switch s {
		case Any:
			return nil, nil
		case None:
			continue
		}
		r, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("network range %q: %w", s, err)
		}
		out = append(out, r.Masked())
	}
	return out, nil
}
