package virt

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

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

// Error names the network, its subnet, the reason and what it collides
// with, fit for a condition message.
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

// Error names the domains that still use the network.
func (e *NetworkInUseError) Error() string {
	return fmt.Sprintf("network %s is still used by domains %s", e.Network, strings.Join(e.Domains, ", "))
}

// Unwrap makes errors.Is(err, ErrNetworkInUse) true.
func (e *NetworkInUseError) Unwrap() error { return ErrNetworkInUse }

// AddressConflictReason is a CamelCase reason, usable as a condition
// reason as is.
type AddressConflictReason string

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

// Error says what keeps the address from being reserved, fit for a
// condition message.
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
