package virt

// OwnedKind is the kind of libvirt object ListOwned reports.
type OwnedKind string

// Kinds of owned objects.
const (
	OwnedDomain  OwnedKind = "domain"
	OwnedNetwork OwnedKind = "network"
	OwnedVolume  OwnedKind = "volume"
)

// OwnedObject is a libvirt object that belongs to the provider.
type OwnedObject struct {
	Kind OwnedKind
	Name string
	// Pool is set for volumes.
	Pool string
	// Owner is nil for volumes, which carry no metadata: their owner follows
	// from the name the caller gave them.
	Owner *Owner
}
