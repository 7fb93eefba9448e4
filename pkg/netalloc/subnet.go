package netalloc

import (
	"errors"
	"fmt"
	"net/netip"
)

// Bounds on the prefix length of a network the provider creates: a /16 is
// already 65534 guests, and a /28 leaves 13 addresses for DHCP after the
// gateway, which is as small as a cluster's network sensibly gets.
const (
	MinPrefixBits = 16
	MaxPrefixBits = 28
)

// InUse is an IPv4 prefix that something on the host already uses, with a
// description of who uses it for error messages, e.g. {10.0.0.0/8, "route
// via eth0"} or {192.168.122.0/24, "libvirt network default"}.
type InUse struct {
	Prefix netip.Prefix
	Owner  string
}

// ConflictError is returned by ChooseSubnet when the requested CIDR overlaps
// something already in use.
type ConflictError struct {
	Requested netip.Prefix
	With      InUse
}

// Error names the conflicting prefix and its owner, e.g. "CIDR 10.0.0.0/24
// conflicts with route via eth0 (10.0.0.0/8)".
func (e *ConflictError) Error() string {
	return fmt.Sprintf("CIDR %s conflicts with %s (%s)", e.Requested, e.With.Owner, e.With.Prefix)
}

// ErrNoFreeSubnet is returned (wrapped) by ChooseSubnet when every candidate
// overlaps something in use.
var ErrNoFreeSubnet = errors.New("no free subnet")

// reservedRanges are IPv4 blocks that cannot carry a guest network whatever
// the host's routes say.
var reservedRanges = []InUse{
	{Prefix: netip.MustParsePrefix("0.0.0.0/8"), Owner: `the "this network" block`},
	{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Owner: "the loopback block"},
	{Prefix: netip.MustParsePrefix("169.254.0.0/16"), Owner: "the link-local block"},
	{Prefix: netip.MustParsePrefix("224.0.0.0/4"), Owner: "the multicast block"},
	{Prefix: netip.MustParsePrefix("240.0.0.0/4"), Owner: "the reserved and broadcast block"},
}

// ValidatePrefix reports whether p can be the CIDR of a network the provider
// creates: IPv4, between /MinPrefixBits and /MaxPrefixBits, written as a
// network address (no host bits set) and outside the loopback, link-local,
// multicast and other reserved blocks.
func ValidatePrefix(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("CIDR %s is not a valid prefix", p)
	case !p.Addr().Is4():
		return fmt.Errorf("CIDR %s is not IPv4; only IPv4 networks are supported", p)
	case p.Bits() < MinPrefixBits || p.Bits() > MaxPrefixBits:
		return fmt.Errorf("CIDR %s: the prefix length must be between /%d and /%d", p, MinPrefixBits, MaxPrefixBits)
	case p != p.Masked():
		return fmt.Errorf("CIDR %s has host bits set; the network address is %s", p, p.Masked())
	}
	if r, found := firstOverlap(p, reservedRanges); found {
		return fmt.Errorf("CIDR %s lies in %s %s", p, r.Owner, r.Prefix)
	}
	return nil
}

// DefaultCandidates returns, in order of preference, the /24s tried when the
// user gives no CIDR: 192.168.150.0/24 to 192.168.250.0/24, then
// 10.200.0.0/24 to 10.239.0.0/24. They avoid libvirt's default
// 192.168.122.0/24, the 192.168.0.x and 192.168.1.x of home routers,
// Docker's 172.17.0.0/16 and the rest of its default pools in 172.16.0.0/12,
// and the usual Kubernetes ranges in 10/8 (10.96.0.0/12 for services,
// 10.244.0.0/16 for flannel pods, 10.42.0.0/15 for k3s, 10.128.0.0/12 for
// CAPD's services). The 10.x candidates each sit in a different /16 so that
// one VPN route does not rule them all out. Calico's customary pod CIDR
// 192.168.0.0/16 covers all the 192.168 candidates, which is one reason the
// cluster's own CIDRs belong in ChooseSubnet's inUse.
//
// The slice is new on every call; callers may change it.
func DefaultCandidates() []netip.Prefix {
	var candidates []netip.Prefix
	for third := byte(150); third <= 250; third++ {
		candidates = append(candidates, netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, third, 0}), 24))
	}
	for second := byte(200); second <= 239; second++ {
		candidates = append(candidates, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, second, 0, 0}), 24))
	}
	return candidates
}

// maxCandidatesPerRange bounds the /24s CandidatesWithin takes from the
// start of one allowed range: enough for the networks of one host.
const maxCandidatesPerRange = 256

// CandidatesWithin returns the candidates of a network that names no CIDR
// when networks may use only ranges: DefaultCandidates inside them or,
// when none is, the first /24s of each range (the range itself when it is
// smaller), so that an operator's range far from the defaults still
// yields a network while ranges around the defaults keep their choice of
// well-known ranges to avoid. nil ranges allow any: DefaultCandidates.
func CandidatesWithin(ranges []netip.Prefix) []netip.Prefix {
	if ranges == nil {
		return DefaultCandidates()
	}
	var out []netip.Prefix
	for _, c := range DefaultCandidates() {
		if Inside(c, ranges) {
			out = append(out, c)
		}
	}
	if len(out) > 0 {
		return out
	}
	for _, r := range ranges {
		out = append(out, firstSubnets(r)...)
	}
	return out
}

// firstSubnets are the first /24s of r, or r itself when it is smaller;
// none when r is no IPv4 range a network may have.
func firstSubnets(r netip.Prefix) []netip.Prefix {
	r = r.Masked()
	if !r.Addr().Is4() {
		return nil
	}
	if r.Bits() >= 24 {
		if ValidatePrefix(r) != nil {
			return nil
		}
		return []netip.Prefix{r}
	}
	var out []netip.Prefix
	base := r.Addr().As4()
	start := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8
	for i := range min(1<<(24-r.Bits()), maxCandidatesPerRange) {
		a := start + uint32(i)<<8
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), 0}), 24)
		if ValidatePrefix(p) == nil {
			out = append(out, p)
		}
	}
	return out
}

// Inside tells whether p lies entirely within one of ranges.
func Inside(p netip.Prefix, ranges []netip.Prefix) bool {
	for _, r := range ranges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// ChooseSubnet picks the CIDR of a new network. If requested is set it is
// validated and returned unless it overlaps an entry of inUse, in which case
// the error is a *ConflictError naming that entry. If requested is the zero
// Prefix, the first valid candidate that overlaps nothing in inUse is
// returned, or an error wrapping ErrNoFreeSubnet.
//
// inUse should hold the host's prefixes (HostPrefixes), every libvirt
// network, active or not (libvirt only notices a clash when the network
// starts), and the workload cluster's pod and service CIDRs, which must not
// overlap the nodes' network either.
func ChooseSubnet(requested netip.Prefix, inUse []InUse, candidates []netip.Prefix) (netip.Prefix, error) {
	if requested != (netip.Prefix{}) {
		if err := ValidatePrefix(requested); err != nil {
			return netip.Prefix{}, err
		}
		if conflict, found := firstOverlap(requested, inUse); found {
			return netip.Prefix{}, &ConflictError{Requested: requested, With: conflict}
		}
		return requested, nil
	}
	for _, candidate := range candidates {
		if err := ValidatePrefix(candidate); err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid candidate: %w", err)
		}
		if _, found := firstOverlap(candidate, inUse); !found {
			return candidate, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: all %d candidate CIDRs overlap a host address or route, another network or the cluster's own CIDRs; set the CIDR explicitly", ErrNoFreeSubnet, len(candidates))
}

func firstOverlap(p netip.Prefix, inUse []InUse) (InUse, bool) {
	for _, u := range inUse {
		if u.Prefix.Overlaps(p) {
			return u, true
		}
	}
	return InUse{}, false
}
