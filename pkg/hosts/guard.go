package hosts

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// lookupTimeout bounds the resolution of a host's name before a connect.
const lookupTimeout = 10 * time.Second

// addressGuard refuses a connect to a host whose name resolves into the
// operator's denied addresses (tenancy.Policy.HostDenyNets): the webhook
// and controllers refuse an address written in the URI, but a name is
// only known once resolved, and may resolve elsewhere on each connect.
type addressGuard struct {
	host   string
	deny   []netip.Prefix
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// check resolves the guarded host and refuses it when any of its
// addresses is denied: libvirt and ssh resolve the name again and may
// pick any of them.
func (g addressGuard) check() error {
	if a, err := netip.ParseAddr(g.host); err == nil {
		return hostDenied(g.host, tenancy.DeniedAddress(a, g.deny))
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	addrs, err := g.lookup(ctx, g.host)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", g.host, err)
	}
	for _, a := range addrs {
		if err := tenancy.DeniedAddress(a, g.deny); err != nil {
			return hostDenied(g.host, err)
		}
	}
	return nil
}

func hostDenied(host string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("libvirt host %s %w", host, err)
}

// guardFor is the guard of a connection to uri under policy, nil when
// none is needed: the operator's own URIs (the manager's, those listed
// exactly) go wherever the operator pointed them.
func guardFor(policy *tenancy.Policy, uri string, lookup func(context.Context, string) ([]netip.Addr, error)) *addressGuard {
	if policy == nil || len(policy.HostDenyNets) == 0 || !policy.OnlyAny(uri) {
		return nil
	}
	u, err := url.Parse(uri)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	return &addressGuard{host: u.Hostname(), deny: policy.HostDenyNets, lookup: lookup}
}

// lookupHost resolves host with the system's resolver.
func lookupHost(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}
