package virt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// NetworkHost covers the networks machines attach to: NAT networks the
// provider creates per cluster, existing libvirt networks and host bridges,
// IP↔MAC reservations, addresses and lease events.
type NetworkHost interface {
	// EnsureNetwork defines, starts and autostarts a NAT network with DHCP,
	// or reuses the one this owner created before. Its subnet overlaps no
	// host address or route and no other libvirt network, active or not;
	// a collision is a *NetworkConflictError.
	EnsureNetwork(ctx context.Context, spec NetworkSpec) (NetworkInfo, error)
	// UseNetwork describes an existing libvirt network the provider does
	// not manage (it is never started, changed or deleted by us).
	UseNetwork(ctx context.Context, name string) (NetworkInfo, error)
	// UseBridge describes a host bridge; machines on it get their
	// addresses from the host's own DHCP, seen only through the guest agent.
	UseBridge(ctx context.Context, bridge string) (NetworkInfo, error)
	// DeleteNetwork destroys and undefines a network the provider created,
	// unless a domain still refers to it (*NetworkInUseError). A missing
	// network is success.
	DeleteNetwork(ctx context.Context, name string) error

	// ReserveAddress pins an IP to a MAC in the network's DHCP server, in
	// the live and the persistent definition, before the machine first
	// starts; it returns the reserved IP. Idempotent per MAC. Conflicts
	// are *AddressConflictError.
	ReserveAddress(ctx context.Context, network string, r Reservation) (netip.Addr, error)
	// ReleaseAddress removes the MAC's host entry; none is success.
	ReleaseAddress(ctx context.Context, network string, mac netalloc.MAC) error
	// ReleaseOwnedAddress removes r.MAC's host entry only when it is
	// r.Owner's; none, or another's, is success.
	ReleaseOwnedAddress(ctx context.Context, network string, r Reservation) error
	// Reservations lists the network's host entries, e.g. to find those
	// whose machine is gone.
	Reservations(ctx context.Context, network string) ([]Reservation, error)
	// SegmentUse describes who holds which address and MAC on a libvirt
	// network (network set) or host bridge: the host's own addresses
	// there, a network's DHCP ranges, host entries and leases, and the
	// domains of any owner with a NIC on it. IsNotFound(err) when the
	// network does not exist.
	SegmentUse(ctx context.Context, network, bridge string) (SegmentUse, error)

	// Addresses reports a machine's addresses: DHCP leases (and the
	// reservation) on libvirt networks, the guest agent's view on bridges.
	Addresses(ctx context.Context, q AddressQuery) ([]Address, error)
	// WatchLease publishes an EventLease (Subscribe) once mac holds a
	// lease on network, polling only while someone waits. It returns at
	// once; ctx bounds the watch, so it must outlive the caller's
	// reconcile.
	WatchLease(ctx context.Context, network string, mac netalloc.MAC) error
}

// NetworkSpec asks for a NAT network.
type NetworkSpec struct {
	// Name of the libvirt network.
	Name string
	// Owner is recorded in the network's <metadata>.
	Owner Owner
	// CIDR is the subnet to use; zero lets EnsureNetwork choose a free
	// one of Candidates.
	CIDR netip.Prefix
	// Candidates are the subnets EnsureNetwork tries, in order, when CIDR
	// is zero; nil tries netalloc.DefaultCandidates.
	Candidates []netip.Prefix
	// Bridge names the Linux bridge; empty derives one from Name that
	// fits the kernel's 15 characters.
	Bridge string
}

// NetworkInfo describes a network machines can attach to.
type NetworkInfo struct {
	// Name is the libvirt network; empty for a host bridge.
	Name string
	// Bridge is the Linux bridge the machines' NICs join.
	Bridge string
	// CIDR is the network's IPv4 subnet; zero when libvirt does not know
	// it (host bridge, network without addressing).
	CIDR netip.Prefix
	// Gateway is the host's address on the network.
	Gateway netip.Addr
	// Managed means the provider created the network and deletes it.
	Managed bool
	// DHCP means libvirt serves DHCP on the network, so reservations,
	// leases and WatchLease work; otherwise addresses come from the guest
	// agent.
	DHCP bool
	// Owner is the object recorded in a managed network's metadata.
	Owner *Owner
}

// hostPrefixes reads the local host's addresses and routes; a variable so
// unit tests can fake the netlink boundary.
var hostPrefixes = netalloc.HostPrefixes

// maxStartAttempts bounds how often EnsureNetwork picks another subnet when
// libvirt refuses to start the chosen one (a collision it saw and we could
// not, e.g. on a remote host, or a network another process defined
// meanwhile).
const maxStartAttempts = 4

// networksLockKey serialises subnet choice and definition within this
// client: two clusters reconciled at once must not pick the same /24. It
// shares the pool lock table; no pool is named with a slash.
const networksLockKey = "network/"

// EnsureNetwork creates or reuses the NAT network spec asks for. A network
// of that name carrying our metadata for the same owner is reused (and
// started and autostarted if it is not); one that is not ours is a
// ConflictName error. When this call defines the network and cannot start
// it, it undefines it again.
func (c *Client) EnsureNetwork(ctx context.Context, spec NetworkSpec) (NetworkInfo, error) {
	if spec.Name == "" {
		return NetworkInfo{}, errors.New("network name is empty")
	}
	bridge := spec.Bridge
	if bridge == "" {
		bridge = netalloc.BridgeName(spec.Name)
	}
	if len(bridge) > 15 {
		return NetworkInfo{}, &NetworkConflictError{Network: spec.Name, Reason: ConflictInvalidSpec,
			With: fmt.Sprintf("bridge name %q is longer than the kernel's 15 characters", bridge)}
	}
	unlock, err := c.lockPool(ctx, networksLockKey)
	if err != nil {
		return NetworkInfo{}, err
	}
	defer unlock()
	var info NetworkInfo
	err = c.withConn(ctx, "EnsureNetwork", func(conn *libvirt.Connect) error {
		net, err := conn.LookupNetworkByName(spec.Name)
		if err == nil {
			defer net.Free()
			info, err = adoptNetwork(net, spec, bridge)
			return err
		}
		if !IsNotFound(err) {
			return err
		}
		info, err = createNetwork(conn, spec, bridge)
		return err
	})
	return info, err
}

// adoptNetwork reuses an existing network if it is ours for the same owner
// and matches spec, starting and autostarting it as needed.
func adoptNetwork(net *libvirt.Network, spec NetworkSpec, bridge string) (NetworkInfo, error) {
	f, err := networkDefinition(net)
	if err != nil {
		return NetworkInfo{}, err
	}
	conflict := func(reason NetworkConflictReason, with string) error {
		return &NetworkConflictError{Network: spec.Name, Reason: reason, Subnet: f.subnet, With: with}
	}
	switch {
	case f.owner == nil:
		return NetworkInfo{}, conflict(ConflictName, "a libvirt network of that name exists and was not created by the provider")
	case !sameOwner(*f.owner, spec.Owner):
		return NetworkInfo{}, conflict(ConflictName, fmt.Sprintf("the network belongs to %s %s/%s of cluster %s",
			f.owner.Kind, f.owner.Namespace, f.owner.Name, f.owner.Cluster))
	case spec.CIDR.IsValid() && spec.CIDR.Masked() != f.subnet:
		return NetworkInfo{}, conflict(ConflictSpecMismatch, fmt.Sprintf("it exists with subnet %s, not %s", f.subnet, spec.CIDR))
	case f.bridge != bridge:
		return NetworkInfo{}, conflict(ConflictSpecMismatch, fmt.Sprintf("it exists with bridge %s, not %s", f.bridge, bridge))
	}
	active, err := net.IsActive()
	if err != nil {
		return NetworkInfo{}, err
	}
	if !active {
		if err := net.Create(); err != nil {
			return NetworkInfo{}, classifyStart(spec.Name, f.subnet, err)
		}
	}
	if err := ensureAutostart(net); err != nil {
		return NetworkInfo{}, err
	}
	return f.info(true), nil
}

// createNetwork chooses a subnet, defines, starts and autostarts a new
// network, undoing the definition when any later step fails.
func createNetwork(conn *libvirt.Connect, spec NetworkSpec, bridge string) (NetworkInfo, error) {
	nets, err := listNetworks(conn)
	if err != nil {
		return NetworkInfo{}, err
	}
	if with, taken := bridgeTaken(nets, spec.Name, bridge); taken {
		return NetworkInfo{}, &NetworkConflictError{Network: spec.Name, Reason: ConflictBridge, With: "bridge " + bridge + " belongs to " + with}
	}
	if hostInterfaceExists(conn, bridge) {
		return NetworkInfo{}, &NetworkConflictError{Network: spec.Name, Reason: ConflictBridge,
			With: "the host already has an interface named " + bridge}
	}
	inUse := networksInUse(nets, spec.Name)
	if uri, err := conn.GetURI(); err == nil && isLocalURI(uri) {
		host, err := hostPrefixes()
		if err != nil {
			return NetworkInfo{}, fmt.Errorf("reading the host's addresses and routes: %w", err)
		}
		inUse = append(inUse, host...)
	}
	for attempt := 1; ; attempt++ {
		subnet, err := netalloc.ChooseSubnet(spec.CIDR, inUse, candidates(spec))
		if err != nil {
			return NetworkInfo{}, subnetError(spec, err)
		}
		info, err := defineAndStart(conn, spec, bridge, subnet)
		var conflict *NetworkConflictError
		if err == nil || spec.CIDR.IsValid() || attempt == maxStartAttempts || !errors.As(err, &conflict) || conflict.Reason != ConflictSubnet {
			return info, err
		}
		inUse = append(inUse, netalloc.InUse{Prefix: subnet, Owner: conflict.With})
	}
}

// candidates are the subnets tried for spec when it names no CIDR.
func candidates(spec NetworkSpec) []netip.Prefix {
	if spec.Candidates == nil {
		return netalloc.DefaultCandidates()
	}
	return spec.Candidates
}

// defineAndStart defines the network and starts and autostarts it; on
// failure nothing of it remains.
func defineAndStart(conn *libvirt.Connect, spec NetworkSpec, bridge string, subnet netip.Prefix) (NetworkInfo, error) {
	def, err := networkXML(spec, bridge, subnet)
	if err != nil {
		return NetworkInfo{}, err
	}
	doc, err := def.Marshal()
	if err != nil {
		return NetworkInfo{}, fmt.Errorf("marshalling network %s: %w", spec.Name, err)
	}
	net, err := conn.NetworkDefineXML(doc)
	if err != nil {
		return NetworkInfo{}, fmt.Errorf("defining network %s: %w", spec.Name, err)
	}
	defer net.Free()
	if err := net.Create(); err != nil {
		_ = net.Undefine()
		return NetworkInfo{}, classifyStart(spec.Name, subnet, err)
	}
	if err := net.SetAutostart(true); err != nil {
		_ = net.Destroy()
		_ = net.Undefine()
		return NetworkInfo{}, fmt.Errorf("autostarting network %s: %w", spec.Name, err)
	}
	owner := spec.Owner
	return NetworkInfo{Name: spec.Name, Bridge: bridge, CIDR: subnet, Gateway: netalloc.Gateway(subnet),
		Managed: true, DHCP: true, Owner: &owner}, nil
}

// classifyStart turns libvirt's refusal to start a colliding network into
// a conflict error carrying libvirt's own words.
func classifyStart(name string, subnet netip.Prefix, err error) error {
	var lerr libvirt.Error
	if errors.As(err, &lerr) && startConflict(lerr.Message) {
		return &NetworkConflictError{Network: name, Reason: ConflictSubnet, Subnet: subnet, With: lerr.Message, Err: err}
	}
	return fmt.Errorf("starting network %s: %w", name, err)
}

// subnetError explains why no subnet could be chosen.
func subnetError(spec NetworkSpec, err error) error {
	e := &NetworkConflictError{Network: spec.Name, Subnet: spec.CIDR, Err: err, With: err.Error()}
	var ce *netalloc.ConflictError
	switch {
	case errors.As(err, &ce):
		e.Reason, e.With = ConflictSubnet, fmt.Sprintf("overlaps %s (%s)", ce.With.Owner, ce.With.Prefix)
	case errors.Is(err, netalloc.ErrNoFreeSubnet):
		e.Reason = ConflictNoFreeSubnet
	default:
		e.Reason = ConflictInvalidSpec
	}
	return e
}

// ensureAutostart makes the network come back after a host reboot.
func ensureAutostart(net *libvirt.Network) error {
	on, err := net.GetAutostart()
	if err != nil || on {
		return err
	}
	return net.SetAutostart(true)
}

// hostInterfaceExists asks libvirt's interface driver, which also works on
// remote hosts, whether the host has an interface of that name. A driver
// that is missing or fails counts as "no": libvirt's start would still
// refuse a clash, and EnsureNetwork then undoes the definition.
func hostInterfaceExists(conn *libvirt.Connect, name string) bool {
	iface, err := conn.LookupInterfaceByName(name)
	if err != nil {
		return false
	}
	_ = iface.Free()
	return true
}
