package virt

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/diskimage"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/imagefetch"
)

// Sentinel errors for the conditions controllers report on their objects.
// Test with errors.Is; the concrete errors wrap them with details.
var (
	// ErrNotFound marks an object (domain, network, pool, volume, guest
	// file) that does not exist. IsNotFound also recognises libvirt's codes.
	ErrNotFound = errors.New("not found")
	// ErrImageNotFound means a base image (source file, URL or base volume)
	// is missing.
	ErrImageNotFound = imagefetch.ErrNotFound
	// ErrPoolFull means the storage pool has no space left for a volume.
	ErrPoolFull = errors.New("storage pool is full")
	// ErrChecksumMismatch means an imported image does not have the
	// expected sha256; nothing was kept.
	ErrChecksumMismatch = errors.New("image checksum mismatch")
	// ErrImageRefused marks an image whose bytes could make the host open
	// another file; ErrImageHasBackingFile, ErrImageHasDataFile and
	// ErrImageFormatUnsupported say which way (*ImageRefusedError); see
	// pkg/virt/diskimage, which decides.
	ErrImageRefused           = diskimage.ErrRefused
	ErrImageHasBackingFile    = diskimage.ErrHasBackingFile
	ErrImageHasDataFile       = diskimage.ErrHasDataFile
	ErrImageFormatUnsupported = diskimage.ErrFormatUnsupported
	// ErrImageLargerThanDisk is a base image whose virtual size is larger
	// than the disk asked for.
	ErrImageLargerThanDisk = diskimage.ErrLargerThanDisk
	// ErrDiskTooLarge is an overlay that would be larger than
	// OverlaySpec.MaxCapacityBytes.
	ErrDiskTooLarge = errors.New("disk larger than allowed")
	// ErrImageTooLarge is a download longer than the operator's bound.
	ErrImageTooLarge = imagefetch.ErrTooLarge
	// ErrImageSourceRefused is an image source the operator does not
	// allow: a file outside the allowed directories, a denied address, a
	// redirect that is not followed.
	ErrImageSourceRefused = imagefetch.ErrSourceRefused
	// ErrDomainReplaced means a domain with the expected name exists but
	// has another UUID: someone replaced it outside the provider.
	ErrDomainReplaced = errors.New("domain replaced outside the provider")
	// ErrDomainStart means libvirt refused to start a domain; the wrapping
	// DomainStartError carries libvirt's message for the user.
	ErrDomainStart = errors.New("domain failed to start")
	// ErrAgentUnavailable means the QEMU guest agent is not connected or
	// not answering (guest still booting, agent not installed).
	ErrAgentUnavailable = errors.New("guest agent unavailable")
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

// IsNotFound reports whether err means the object does not exist, either
// as our ErrNotFound or as one of libvirt's "no such object" codes.
func IsNotFound(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrNotFound) {
		return true
	}
	var lerr libvirt.Error
	if !errors.As(err, &lerr) {
		return false
	}
	switch lerr.Code {
	case libvirt.ERR_NO_DOMAIN, libvirt.ERR_NO_NETWORK, libvirt.ERR_NO_STORAGE_POOL,
		libvirt.ERR_NO_STORAGE_VOL, libvirt.ERR_NO_NETWORK_PORT, libvirt.ERR_NO_DOMAIN_METADATA,
		libvirt.ERR_NO_DOMAIN_SNAPSHOT, libvirt.ERR_NO_DOMAIN_CHECKPOINT, libvirt.ERR_NO_INTERFACE,
		libvirt.ERR_NO_SECRET, libvirt.ERR_NO_NWFILTER, libvirt.ERR_NO_NODE_DEVICE:
		return true
	}
	return false
}

// ChecksumError details ErrChecksumMismatch.
type ChecksumError struct {
	Source   string
	Expected string
	Actual   string
}

// Error names the source and the expected digest, never the computed one:
// the message reaches conditions a tenant reads, and the digest of a file
// the tenant could not otherwise read would tell them about it.
func (e *ChecksumError) Error() string {
	return fmt.Sprintf("%s: sha256 does not match the expected %s", RedactURL(e.Source), e.Expected)
}

// Unwrap makes errors.Is(err, ErrChecksumMismatch) true.
func (e *ChecksumError) Unwrap() error { return ErrChecksumMismatch }

// DomainReplacedError details ErrDomainReplaced.
type DomainReplacedError struct {
	Name         string
	ExpectedUUID string
	ActualUUID   string
}

// Error names the domain and both UUIDs.
func (e *DomainReplacedError) Error() string {
	return fmt.Sprintf("domain %s has UUID %s, expected %s: replaced outside the provider",
		e.Name, e.ActualUUID, e.ExpectedUUID)
}

// Unwrap makes errors.Is(err, ErrDomainReplaced) true.
func (e *DomainReplacedError) Unwrap() error { return ErrDomainReplaced }

// DomainStartError details ErrDomainStart with libvirt's own explanation,
// which is what a user needs to see in a condition.
type DomainStartError struct {
	Name    string
	Message string
	cause   error
}

// Error carries libvirt's message verbatim.
func (e *DomainStartError) Error() string {
	return fmt.Sprintf("domain %s failed to start: %s", e.Name, e.Message)
}

// Unwrap makes errors.Is(err, ErrDomainStart) true and keeps libvirt's
// error reachable.
func (e *DomainStartError) Unwrap() []error { return []error{ErrDomainStart, e.cause} }

// isNoSpace reports whether err is libvirt (or the OS) saying the disk is
// full, so storage calls can surface ErrPoolFull.
func isNoSpace(err error) bool {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	var lerr libvirt.Error
	if !errors.As(err, &lerr) {
		return false
	}
	m := strings.ToLower(lerr.Message)
	return strings.Contains(m, "no space left") || strings.Contains(m, "not enough space") ||
		strings.Contains(m, "disk quota exceeded") || strings.Contains(m, "insufficient free space")
}

// wrapNoSpace turns a no-space failure into ErrPoolFull, keeping libvirt's
// message.
func wrapNoSpace(pool string, err error) error {
	switch {
	case err == nil || !isNoSpace(err):
		return err
	case pool == "":
		return fmt.Errorf("%w: %w", ErrPoolFull, err)
	default:
		return fmt.Errorf("%w: pool %s: %w", ErrPoolFull, pool, err)
	}
}

// connLossMessage matches the messages libvirt's RPC layer uses when the
// daemon went away underneath an established connection.
func connLossMessage(msg string) bool {
	for _, s := range []string{
		"client socket is closed", "Broken pipe", "End of file while reading data",
		"Connection reset by peer", "connection closed", "Cannot recv data", "Cannot write data",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// ignoreNotFound returns nil for not-found errors: every delete succeeds
// when its object is already gone.
func ignoreNotFound(err error) error {
	if IsNotFound(err) {
		return nil
	}
	return err
}

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
	// ConflictMACOwned: the MAC's entry is another object's (its name,
	// or the domains using the MAC, say so).
	ConflictMACOwned AddressConflictReason = "MACOwnedByAnother"
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
	MAC     netalloc.MAC
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

// ImageRefusedError details why an image is not imported or not used as
// a base (diskimage.RefusedError).
type ImageRefusedError = diskimage.RefusedError

// IsImageRefused reports whether err refuses an image for what its bytes are.
func IsImageRefused(err error) bool { return diskimage.IsRefused(err) }

// SourcePolicy is what the operator lets image sources reach
// (imagefetch.Policy).
type SourcePolicy = imagefetch.Policy

// MaxRedirects is how many redirects a download follows.
const MaxRedirects = imagefetch.MaxRedirects

// ErrFetchIdle is the cause of a download that got no data for its idle
// timeout.
var ErrFetchIdle = imagefetch.ErrIdle

// RedactURL is raw without userinfo and query, as conditions and events
// may show it (imagefetch.RedactURL).
func RedactURL(raw string) string { return imagefetch.RedactURL(raw) }
