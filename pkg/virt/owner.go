package virt

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
)

const (
	// OwnerNamespace is the XML namespace of our ownership element inside
	// a domain's or network's <metadata>.
	OwnerNamespace = "https://capi-libvirt.dev/xmlns/owner/v1"
	// OwnerPrefix is the namespace prefix libvirt records for OwnerNamespace.
	OwnerPrefix = "capl"
	// NamePrefix starts the name of every libvirt object the provider
	// creates. Volumes carry no metadata, so the prefix is how orphan
	// listing recognises them.
	NamePrefix = "capl-"
	// TestNamePrefix starts the names of objects created by tests, so that
	// a leftover from a test run is never mistaken for a real cluster's.
	TestNamePrefix = "capltest-"
)

// Owner identifies the Kubernetes object that owns a libvirt object.
type Owner struct {
	// Kind of the owning object, e.g. LibvirtMachine or LibvirtCluster.
	Kind string
	// Namespace of the owning object.
	Namespace string
	// Name of the owning object.
	Name string
	// UID of the owning object when the libvirt object was made; a
	// clusterctl move or a restore gives the object another, so it is a
	// record, never a key (IsObject does not compare it).
	UID string
	// Cluster is the name of the CAPI Cluster the object belongs to.
	Cluster string
}

// IsObject tells whether o names the same Kubernetes object as other:
// kind, namespace and name, which survive a move; the UID does not.
func (o *Owner) IsObject(other Owner) bool {
	return o != nil && o.Kind == other.Kind && o.Namespace == other.Namespace && o.Name == other.Name
}

// ownerXML is the wire form of Owner. The element lives in OwnerNamespace;
// libvirt keys metadata elements by namespace, so other tools' metadata in
// the same <metadata> block is left alone.
type ownerXML struct {
	XMLName xml.Name `xml:"https://capi-libvirt.dev/xmlns/owner/v1 owner"`
	ownerFields
}

// ownerFields are the children of the owner element.
type ownerFields struct {
	Kind      string `xml:"kind"`
	Namespace string `xml:"namespace"`
	Name      string `xml:"name"`
	UID       string `xml:"uid"`
	Cluster   string `xml:"cluster"`
	// Addresses are a domain's static addresses (IPAM pools), recorded
	// where the tenant cannot write them: what the guest holds, which
	// the provider compares its claims with and another VM's pool
	// address with. Networks record none.
	Addresses []string `xml:"address,omitempty"`
}

func (f ownerFields) owner() *Owner {
	return &Owner{Kind: f.Kind, Namespace: f.Namespace, Name: f.Name, UID: f.UID, Cluster: f.Cluster}
}

// MetadataXML renders the owner element that goes into <metadata>.
func (o Owner) MetadataXML() (string, error) { return o.metadataXML(nil) }

// metadataXML renders the owner element of a domain holding addresses
// statically.
func (o Owner) metadataXML(addresses []netip.Addr) (string, error) {
	f := ownerFields{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, UID: o.UID, Cluster: o.Cluster}
	for _, a := range addresses {
		f.Addresses = append(f.Addresses, a.String())
	}
	b, err := xml.Marshal(ownerXML{ownerFields: f})
	if err != nil {
		return "", fmt.Errorf("marshalling owner: %w", err)
	}
	return string(b), nil
}

// ParseOwner finds our owner element in a <metadata> body (or a whole
// document containing one) and decodes it. It returns ErrNotFound when
// there is none, so objects created by others are recognisably not ours.
func ParseOwner(metadata string) (*Owner, error) {
	f, err := parseOwnerFields(metadata)
	if err != nil {
		return nil, err
	}
	return f.owner(), nil
}

// recordedAddresses are the static addresses a domain's owner element
// records; nil when it records none or does not parse.
func (f ownerFields) recordedAddresses() []netip.Addr {
	var out []netip.Addr
	for _, s := range f.Addresses {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// parseOwnerFields finds our owner element in a <metadata> body and
// decodes it whole; ErrNotFound when there is none.
func parseOwnerFields(metadata string) (ownerFields, error) {
	dec := xml.NewDecoder(bytes.NewReader([]byte(metadata)))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return ownerFields{}, fmt.Errorf("owner metadata: %w", ErrNotFound)
		}
		if err != nil {
			return ownerFields{}, fmt.Errorf("parsing owner metadata: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Space != OwnerNamespace || se.Name.Local != "owner" {
			continue
		}
		var ox ownerXML
		if err := dec.DecodeElement(&ox, &se); err != nil {
			return ownerFields{}, fmt.Errorf("parsing owner metadata: %w", err)
		}
		return ox.ownerFields, nil
	}
}

// parseOwnerElement decodes the element virDomainGetMetadata returns for
// OwnerNamespace: libvirt has already selected it by namespace and hands it
// back with the namespace stripped.
func parseOwnerElement(elem string) (*Owner, error) {
	var ox struct {
		XMLName xml.Name
		ownerFields
	}
	if err := xml.Unmarshal([]byte(elem), &ox); err != nil {
		return nil, fmt.Errorf("parsing owner metadata: %w", err)
	}
	if ox.XMLName.Local != "owner" {
		return nil, fmt.Errorf("owner metadata: unexpected element <%s>: %w", ox.XMLName.Local, ErrNotFound)
	}
	return ox.owner(), nil
}
