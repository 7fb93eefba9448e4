package virt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

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
	ReleaseAddress(ctx context.Context, network, mac string) error
	// Reservations lists the network's host entries, e.g. to find those
	// whose machine is gone.
	Reservations(ctx context.Context, network string) ([]Reservation, error)

	// Addresses reports a machine's addresses: DHCP leases (and the
	// reservation) on libvirt networks, the guest agent's view on bridges.
	Addresses(ctx context.Context, q AddressQuery) ([]Address, error)
	// WatchLease publishes an EventLease (Subscribe) once mac holds a
	// lease on network, polling only while someone waits. It returns at
	// once; ctx bounds the watch, so it must outlive the caller's
	// reconcile.
	WatchLease(ctx context.Context, network, mac string) error
}

// NetworkSpec asks for a NAT network.
type NetworkSpec struct {
	// Name of the libvirt network.
	Name string
	// Owner is recorded in the network's <metadata>.
	Owner Owner
	// CIDR is the subnet to use; zero lets EnsureNetwork choose a free /24.
	CIDR netip.Prefix
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

// Reservation is a DHCP host entry: MAC always gets IP.
type Reservation struct {
	// MAC is compared case-insensitively.
	MAC string
	// IP is the pinned address; zero asks ReserveAddress to pick the next
	// one that is neither reserved nor leased.
	IP netip.Addr
	// Hostname, optional, is also published in the network's DNS; libvirt
	// requires it to be unique in the network.
	Hostname string
}

var (
	// ErrNetworkConflict marks a network that cannot be created or reused
	// as asked; *NetworkConflictError says why.
	ErrNetworkConflict = errors.New("network conflict")
	// ErrNetworkInUse marks a network that domains still refer to.
	ErrNetworkInUse = errors.New("network in use")
	// ErrNetworkNotOwned marks a network the provider did not create, which
	// it therefore refuses to delete.
	ErrNetworkNotOwned = errors.New("network not created by the provider")
	// ErrNetworkInactive marks an existing, unmanaged network that is not
	// running; the provider does not start networks it does not own.
	ErrNetworkInactive = errors.New("network is not active")
	// ErrNoDHCP marks a network whose DHCP libvirt does not serve, so
	// reservations and leases do not exist there.
	ErrNoDHCP = errors.New("network has no libvirt DHCP")
	// ErrAddressConflict marks an address that cannot be reserved;
	// *AddressConflictError says why.
	ErrAddressConflict = errors.New("address conflict")
)

// NetworkConflictReason is a CamelCase reason, usable as a condition
// reason as is.
type NetworkConflictReason string

// Reasons of NetworkConflictError.
const (
	// ConflictSubnet: the subnet overlaps a host address or route or
	// another libvirt network.
	ConflictSubnet NetworkConflictReason = "SubnetConflict"
	// ConflictNoFreeSubnet: every candidate subnet is taken.
	ConflictNoFreeSubnet NetworkConflictReason = "NoFreeSubnet"
	// ConflictInvalidSpec: the requested CIDR or bridge name is unusable.
	ConflictInvalidSpec NetworkConflictReason = "InvalidNetworkSpec"
	// ConflictName: a network of that name exists and belongs to someone
	// else.
	ConflictName NetworkConflictReason = "NetworkNameTaken"
	// ConflictBridge: the bridge name is used by another network or a host
	// interface.
	ConflictBridge NetworkConflictReason = "BridgeConflict"
	// ConflictSpecMismatch: our existing network has another CIDR or bridge
	// than now requested; it is not changed under running machines.
	ConflictSpecMismatch NetworkConflictReason = "NetworkSpecMismatch"
)

// NetworkConflictError details ErrNetworkConflict: With names what the
// network collides with, in words fit for a condition message.
type NetworkConflictError struct {
	Network string
	Reason  NetworkConflictReason
	// Subnet is the requested or chosen subnet, when there is one.
	Subnet netip.Prefix
	With   string
	// Err is the underlying error (e.g. *netalloc.ConflictError).
	Err error
}

func (e *NetworkConflictError) Error() string {
	s := "network " + e.Network
	if e.Subnet.IsValid() {
		s += " (" + e.Subnet.String() + ")"
	}
	return s + ": " + string(e.Reason) + ": " + e.With
}

// Unwrap makes errors.Is(err, ErrNetworkConflict) true and exposes the
// cause.
func (e *NetworkConflictError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNetworkConflict}
	}
	return []error{ErrNetworkConflict, e.Err}
}

// NetworkInUseError details ErrNetworkInUse.
type NetworkInUseError struct {
	Network string
	// Domains refer to the network, running or not.
	Domains []string
}

func (e *NetworkInUseError) Error() string {
	return fmt.Sprintf("network %s is still used by domains %s", e.Network, strings.Join(e.Domains, ", "))
}

// Unwrap makes errors.Is(err, ErrNetworkInUse) true.
func (e *NetworkInUseError) Unwrap() error { return ErrNetworkInUse }

// AddressConflictReason is a CamelCase reason, usable as a condition
// reason as is.
type AddressConflictReason string

// Reasons of AddressConflictError.
const (
	// ConflictIPReserved: the IP is reserved for another MAC (HeldBy).
	ConflictIPReserved AddressConflictReason = "AddressReserved"
	// ConflictLeased: the IP is leased to another MAC (HeldBy) until
	// Until; typically the lease of a deleted machine, which dnsmasq
	// keeps until it expires.
	ConflictLeased AddressConflictReason = "AddressLeased"
	// ConflictMACReserved: the MAC is already reserved with another IP.
	ConflictMACReserved AddressConflictReason = "MACReserved"
	// ConflictHostnameReserved: another MAC (HeldBy) has that hostname.
	ConflictHostnameReserved AddressConflictReason = "HostnameReserved"
	// ConflictOutsideSubnet: the IP is not a usable host address of the
	// network (HeldBy gives the usable range).
	ConflictOutsideSubnet AddressConflictReason = "AddressOutsideSubnet"
	// ConflictNoFreeAddress: every address is reserved or leased.
	ConflictNoFreeAddress AddressConflictReason = "NoFreeAddress"
)

// AddressConflictError details ErrAddressConflict.
type AddressConflictError struct {
	Network string
	MAC     string
	IP      netip.Addr
	Reason  AddressConflictReason
	// HeldBy names the conflicting holder (a MAC) or gives details.
	HeldBy string
	// Until is when a conflicting lease expires (zero: never, or not a
	// lease); retry after it.
	Until time.Time
}

func (e *AddressConflictError) Error() string {
	s := fmt.Sprintf("network %s: cannot reserve", e.Network)
	if e.IP.IsValid() {
		s += " " + e.IP.String()
	}
	s += fmt.Sprintf(" for %s: %s: %s", e.MAC, e.Reason, e.HeldBy)
	if !e.Until.IsZero() {
		s += " until " + e.Until.UTC().Format(time.RFC3339)
	}
	return s
}

// Unwrap makes errors.Is(err, ErrAddressConflict) true.
func (e *AddressConflictError) Unwrap() error { return ErrAddressConflict }

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
		subnet, err := netalloc.ChooseSubnet(spec.CIDR, inUse, netalloc.DefaultCandidates())
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

// listNetworks reads every libvirt network's persistent definition (the
// live one for transient networks), the one that matters at its next start.
func listNetworks(conn *libvirt.Connect) ([]libvirtNetwork, error) {
	nets, err := conn.ListAllNetworks(0)
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	defer func() {
		for i := range nets {
			_ = nets[i].Free()
		}
	}()
	out := make([]libvirtNetwork, 0, len(nets))
	for i := range nets {
		f, err := networkDefinition(&nets[i])
		if IsNotFound(err) {
			continue // undefined meanwhile
		}
		if err != nil {
			return nil, err
		}
		active, err := nets[i].IsActive()
		if IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, libvirtNetwork{facts: f, active: active})
	}
	return out, nil
}

// networkDefinition parses a network's persistent definition, or its live
// one when it is transient.
func networkDefinition(net *libvirt.Network) (networkFacts, error) {
	return networkXMLFacts(net, libvirt.NETWORK_XML_INACTIVE)
}

func networkXMLFacts(net *libvirt.Network, flags libvirt.NetworkXMLFlags) (networkFacts, error) {
	doc, err := net.GetXMLDesc(flags)
	if err != nil {
		return networkFacts{}, err
	}
	return parseNetwork(doc)
}

// info describes a network from its facts.
func (f networkFacts) info(managed bool) NetworkInfo {
	info := NetworkInfo{Name: f.name, Bridge: f.bridge, CIDR: f.subnet, Managed: managed, DHCP: f.dhcp}
	if f.subnet.IsValid() {
		info.Gateway = netalloc.Gateway(f.subnet)
	}
	if managed {
		info.Owner = f.owner
	}
	return info
}

// UseNetwork describes an existing network without taking it over: it
// must be running, and it is reported as unmanaged even if it carries our
// metadata, so the caller never deletes a network it only refers to.
func (c *Client) UseNetwork(ctx context.Context, name string) (NetworkInfo, error) {
	var info NetworkInfo
	err := c.withNetwork(ctx, "UseNetwork", name, func(_ *libvirt.Connect, net *libvirt.Network) error {
		active, err := net.IsActive()
		if err != nil {
			return err
		}
		if !active {
			return fmt.Errorf("network %s: %w", name, ErrNetworkInactive)
		}
		f, err := networkXMLFacts(net, 0)
		if err != nil {
			return err
		}
		info = f.info(false)
		return nil
	})
	return info, err
}

// UseBridge describes a host bridge. Whether it exists is asked from
// libvirt's interface driver, so this also works for remote hosts; when
// that driver is unavailable the bridge is taken on trust and a missing
// one shows up when the domain starts.
func (c *Client) UseBridge(ctx context.Context, bridge string) (NetworkInfo, error) {
	err := c.withConn(ctx, "UseBridge", func(conn *libvirt.Connect) error {
		iface, err := conn.LookupInterfaceByName(bridge)
		if IsNotFound(err) {
			return fmt.Errorf("host bridge %s: %w", bridge, ErrNotFound)
		}
		if err != nil {
			return nil // no interface driver: see above
		}
		defer iface.Free()
		doc, err := iface.GetXMLDesc(0)
		if err != nil {
			return err
		}
		var x libvirtxml.Interface
		if err := x.Unmarshal(doc); err != nil {
			return fmt.Errorf("parsing interface %s: %w", bridge, err)
		}
		if x.Bridge == nil {
			return fmt.Errorf("host interface %s is not a bridge", bridge)
		}
		return nil
	})
	if err != nil {
		return NetworkInfo{}, err
	}
	return NetworkInfo{Bridge: bridge}, nil
}

// DeleteNetwork removes a network the provider created once no domain,
// running or merely defined, refers to it (a defined domain would fail to
// start later). Not-found is success; a network without our metadata is
// refused with ErrNetworkNotOwned.
func (c *Client) DeleteNetwork(ctx context.Context, name string) error {
	err := c.withNetwork(ctx, "DeleteNetwork", name, func(conn *libvirt.Connect, net *libvirt.Network) error {
		f, err := networkDefinition(net)
		if err != nil {
			return err
		}
		if f.owner == nil {
			return fmt.Errorf("network %s: %w", name, ErrNetworkNotOwned)
		}
		users, err := domainsUsing(conn, name, f.bridge)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return &NetworkInUseError{Network: name, Domains: users}
		}
		active, err := net.IsActive()
		if err != nil {
			return err
		}
		if active {
			if err := net.Destroy(); ignoreNotFound(err) != nil {
				return fmt.Errorf("destroying network %s: %w", name, err)
			}
		}
		if persistent, err := net.IsPersistent(); err != nil || !persistent {
			return ignoreNotFound(err)
		}
		if err := net.Undefine(); ignoreNotFound(err) != nil {
			return fmt.Errorf("undefining network %s: %w", name, err)
		}
		return nil
	})
	return ignoreNotFound(err)
}

// domainsUsing lists the domains whose live or persistent definition has
// an interface on the network or its bridge, sorted by name.
func domainsUsing(conn *libvirt.Connect, name, bridge string) ([]string, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	defer func() {
		for i := range doms {
			_ = doms[i].Free()
		}
	}()
	var users []string
	for i := range doms {
		uses, err := domainUses(&doms[i], name, bridge)
		if IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if uses {
			dn, err := doms[i].GetName()
			if err != nil {
				return nil, err
			}
			users = append(users, dn)
		}
	}
	sort.Strings(users)
	return users, nil
}

// domainUses checks both definitions: a running domain's persistent config
// may differ from its live one after hot-plugging.
func domainUses(dom *libvirt.Domain, name, bridge string) (bool, error) {
	for _, flags := range []libvirt.DomainXMLFlags{0, libvirt.DOMAIN_XML_INACTIVE} {
		doc, err := dom.GetXMLDesc(flags)
		if err != nil {
			return false, err
		}
		if uses, err := interfaceUses(doc, name, bridge); err != nil || uses {
			return uses, err
		}
	}
	return false, nil
}

// withNetwork looks a network up and runs fn on it; a missing network is
// an error that IsNotFound recognises. op names the operation as withConn's.
func (c *Client) withNetwork(ctx context.Context, op, name string, fn func(*libvirt.Connect, *libvirt.Network) error) error {
	return c.withConn(ctx, op, func(conn *libvirt.Connect) error {
		net, err := conn.LookupNetworkByName(name)
		if err != nil {
			if IsNotFound(err) {
				return fmt.Errorf("network %s: %w", name, ErrNotFound)
			}
			return err
		}
		defer net.Free()
		return fn(conn, net)
	})
}

// networkViews are a network's two definitions and its leases: host
// entries live in both, and they can differ (an entry added to a stopped
// network exists only in the persistent one until it starts).
type networkViews struct {
	facts  networkFacts   // persistent definition, else live
	live   *[]Reservation // nil when the network is not active
	config *[]Reservation // nil when the network is transient
	leases []dhcpLease
	active bool
}

// readViews reads what ReserveAddress and friends need about a network.
func readViews(net *libvirt.Network, name string, withLeases bool) (networkViews, error) {
	var v networkViews
	active, err := net.IsActive()
	if err != nil {
		return v, err
	}
	persistent, err := net.IsPersistent()
	if err != nil {
		return v, err
	}
	v.active = active
	if persistent {
		if v.facts, err = networkDefinition(net); err != nil {
			return v, err
		}
		hosts := v.facts.hosts
		v.config = &hosts
	}
	if active {
		live, err := networkXMLFacts(net, 0)
		if err != nil {
			return v, err
		}
		if !persistent {
			v.facts = live
		}
		v.live = &live.hosts
		if withLeases {
			if v.leases, err = networkLeases(net); err != nil {
				return v, err
			}
		}
	}
	if !v.facts.dhcp || !v.facts.subnet.IsValid() {
		return v, fmt.Errorf("network %s: %w", name, ErrNoDHCP)
	}
	return v, nil
}

// updateFlags selects the definitions a host-entry update applies to.
func updateFlags(live, config bool) libvirt.NetworkUpdateFlags {
	var f libvirt.NetworkUpdateFlags
	if live {
		f |= libvirt.NETWORK_UPDATE_AFFECT_LIVE
	}
	if config {
		f |= libvirt.NETWORK_UPDATE_AFFECT_CONFIG
	}
	return f
}

// ReserveAddress adds the host entry for r (see NetworkHost). The entry
// goes into the live network, so dnsmasq honours it at once, and into the
// persistent definition, so it survives a network restart. Reservations
// on one network are serialised within this client; across processes
// libvirt itself rejects a second entry for the same IP, MAC or name.
func (c *Client) ReserveAddress(ctx context.Context, network string, r Reservation) (netip.Addr, error) {
	mac, err := normalizeMAC(r.MAC)
	if err != nil {
		return netip.Addr{}, err
	}
	r.MAC = mac
	unlock, err := c.lockPool(ctx, networksLockKey+network)
	if err != nil {
		return netip.Addr{}, err
	}
	defer unlock()
	var ip netip.Addr
	err = c.withNetwork(ctx, "ReserveAddress", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, true)
		if err != nil {
			return err
		}
		plan, err := planReservation(network, v.facts.subnet, v.live, v.config, v.leases, r, time.Now())
		if err != nil {
			return err
		}
		ip = plan.ip
		if !plan.addLive && !plan.addConfig {
			return nil
		}
		doc, err := hostEntryXML(r.MAC, plan.ip, r.Hostname)
		if err != nil {
			return err
		}
		err = net.Update(libvirt.NETWORK_UPDATE_COMMAND_ADD_LAST, libvirt.NETWORK_SECTION_IP_DHCP_HOST,
			v.facts.ipIndex, doc, updateFlags(plan.addLive, plan.addConfig))
		if err != nil {
			return fmt.Errorf("reserving %s for %s on network %s: %w", plan.ip, r.MAC, network, err)
		}
		return nil
	})
	return ip, err
}

// ReleaseAddress removes mac's host entry from the live and persistent
// definitions. The guest's lease outlives it: dnsmasq drops it when the
// guest releases it (a graceful shutdown does, through dhclient) or when it
// expires, at most reservationLease later. Until then ReserveAddress
// refuses that IP to another MAC (ConflictLeased, with the expiry) and
// never picks it by itself.
func (c *Client) ReleaseAddress(ctx context.Context, network, mac string) error {
	unlock, err := c.lockPool(ctx, networksLockKey+network)
	if err != nil {
		return err
	}
	defer unlock()
	err = c.withNetwork(ctx, "ReleaseAddress", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, false)
		if errors.Is(err, ErrNoDHCP) {
			return nil // nothing can be reserved there
		}
		if err != nil {
			return err
		}
		live, inLive := findMAC(deref(v.live), mac)
		config, inConfig := findMAC(deref(v.config), mac)
		if !inLive && !inConfig {
			return nil
		}
		entry := live.MAC
		if !inLive {
			entry = config.MAC
		}
		doc, err := hostDeleteXML(entry)
		if err != nil {
			return err
		}
		err = net.Update(libvirt.NETWORK_UPDATE_COMMAND_DELETE, libvirt.NETWORK_SECTION_IP_DHCP_HOST,
			v.facts.ipIndex, doc, updateFlags(inLive, inConfig))
		if err != nil {
			return fmt.Errorf("releasing %s on network %s: %w", mac, network, err)
		}
		return nil
	})
	return ignoreNotFound(err)
}

func deref(s *[]Reservation) []Reservation {
	if s == nil {
		return nil
	}
	return *s
}

// Reservations lists the host entries of both definitions, each MAC once.
func (c *Client) Reservations(ctx context.Context, network string) ([]Reservation, error) {
	var out []Reservation
	err := c.withNetwork(ctx, "Reservations", network, func(_ *libvirt.Connect, net *libvirt.Network) error {
		v, err := readViews(net, network, false)
		if err != nil {
			return err
		}
		out = mergeReservations(deref(v.live), deref(v.config))
		return nil
	})
	return out, err
}
