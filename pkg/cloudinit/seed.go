package cloudinit

import (
	"errors"
	"fmt"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Seed is the NoCloud data for one guest.
//
// Seed redacts UserData, NetworkConfig and VendorData when formatted with
// fmt or logged through logr, so logging a Seed by mistake does not leak
// bootstrap secrets.
type Seed struct {
	// InstanceID is the domain UUID. cloud-init runs its first-boot modules
	// (and so the bootstrap) again whenever this value changes.
	InstanceID string
	// LocalHostname becomes the guest's hostname and so its Node name.
	LocalHostname string
	// UserData is the bootstrap data: a secret, never log it.
	UserData []byte
	// NetworkConfig is optional; it is left out of the ISO when empty.
	NetworkConfig []byte
	// VendorData is optional; it is left out of the ISO when empty.
	// cloud-init runs it next to the user-data (see
	// BootstrapSentinelVendorData).
	VendorData []byte
}

// metaData is the NoCloud meta-data document. It is marshalled rather than
// assembled from strings so that no value can break out of its YAML scalar,
// and values YAML 1.1 would read as other types (on, 123) stay strings.
type metaData struct {
	InstanceID    string `json:"instance-id"`
	LocalHostname string `json:"local-hostname"`
}

// MetaData returns the NoCloud meta-data YAML document for s, after
// validating s.
func (s Seed) MetaData() ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return yaml.Marshal(metaData{InstanceID: s.InstanceID, LocalHostname: s.LocalHostname})
}

// Validate reports whether s can be written as a seed: the instance-id must be
// present and the hostname must be a lower-case RFC 1123 DNS name (a label or
// an FQDN) such as Kubernetes requires of a Node name.
func (s Seed) Validate() error {
	return errors.Join(validateInstanceID(s.InstanceID), validateHostname(s.LocalHostname))
}

// validateInstanceID rejects whitespace, control characters and '/', because
// cloud-init uses the instance-id as a directory name under
// /var/lib/cloud/instances.
func validateInstanceID(id string) error {
	if id == "" {
		return errors.New("instance-id is empty")
	}
	if strings.ContainsFunc(id, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == '/' }) {
		return fmt.Errorf("instance-id %q contains whitespace, a control character or '/'", id)
	}
	return nil
}

func validateHostname(hostname string) error {
	if hostname == "" {
		return errors.New("local-hostname is empty")
	}
	if msgs := validation.IsDNS1123Subdomain(hostname); len(msgs) > 0 {
		return fmt.Errorf("local-hostname %q is not a valid DNS name: %s", hostname, strings.Join(msgs, "; "))
	}
	// IsDNS1123Subdomain bounds only the whole name; DNS also bounds each label.
	for label := range strings.SplitSeq(hostname, ".") {
		if len(label) > validation.DNS1123LabelMaxLength {
			return fmt.Errorf("local-hostname %q has a label longer than %d characters", hostname, validation.DNS1123LabelMaxLength)
		}
	}
	return nil
}

// String describes s without the contents of UserData, NetworkConfig and
// VendorData.
func (s Seed) String() string {
	return fmt.Sprintf("{InstanceID:%s LocalHostname:%s UserData:<%d bytes redacted> NetworkConfig:<%d bytes redacted> VendorData:<%d bytes redacted>}",
		s.InstanceID, s.LocalHostname, len(s.UserData), len(s.NetworkConfig), len(s.VendorData))
}

// GoString makes %#v redact like String.
func (s Seed) GoString() string {
	return "cloudinit.Seed" + s.String()
}

// MarshalLog implements logr.Marshaler so that structured loggers, which
// would otherwise encode the byte slices, log only their sizes.
func (s Seed) MarshalLog() any {
	return struct {
		InstanceID         string `json:"instanceID"`
		LocalHostname      string `json:"localHostname"`
		UserDataBytes      int    `json:"userDataBytes"`
		NetworkConfigBytes int    `json:"networkConfigBytes"`
		VendorDataBytes    int    `json:"vendorDataBytes"`
	}{s.InstanceID, s.LocalHostname, len(s.UserData), len(s.NetworkConfig), len(s.VendorData)}
}
