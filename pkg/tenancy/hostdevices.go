package tenancy

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

// HostDevice is a PCI device of the libvirt hosts that the operator lets
// a machine take whole (the manager's --host-devices). Tenants name it by
// its alias: a raw address would let a namespace take any device of the
// host, its disk controller or its NIC included. An address alone means
// different devices on different hosts, so the operator binds the alias
// to what it means: the device's IDs, and optionally its one host.
type HostDevice struct {
	// Alias is the name machines give in spec.hostDevices.
	Alias string
	// Address is the device on every host that has it.
	Address pci.Address
	// Resource is the extended resource the device gives a Node (for
	// example nvidia.com/gpu), which a LibvirtMachineTemplate reports in
	// its capacity for the cluster autoscaler; empty for none.
	Resource corev1.ResourceName
	// IDs are the vendor and device IDs the device at Address must have;
	// zero when the operator gave none (then only its class and IOMMU
	// group are checked).
	IDs pci.IDs
	// Host is the one host whose device this is, by the name
	// status.domain.host shows; empty for every host.
	Host string
	// Allow are the families of classes (storage, network, bridge) the
	// device may belong to; the provider refuses them otherwise.
	Allow []pci.Kind
}

// OnHost tells whether the alias names a device of the host called host.
func (d HostDevice) OnHost(host string) bool { return d.Host == "" || d.Host == host }

// Allows tells whether the operator lets a device of kind k through.
func (d HostDevice) Allows(k pci.Kind) bool { return k == "" || slices.Contains(d.Allow, k) }

// hostDeviceOptions are the keys of the options an entry of --host-devices
// takes after its address. The flag splits its value at commas, so an
// entry of the form KEY=VALUE with one of these keys belongs to the entry
// before it; none may be an alias.
var hostDeviceOptions = []string{"vendor", "device", "host", "allow"}

// hostDeviceSyntax is the form of one entry, for errors.
const hostDeviceSyntax = "ALIAS=ADDRESS[/RESOURCE][,vendor=VVVV,device=DDDD][,host=HOST][,allow=storage|network|bridge]" +
	" (gpu0=0000:65:00.0/nvidia.com/gpu,vendor=10de,device=2204)"

// ParseHostDevices reads the manager's --host-devices entries, each
//
//	ALIAS=ADDRESS[/RESOURCE][,vendor=VVVV,device=DDDD][,host=HOST][,allow=KIND]...
//
// as gpu0=0000:65:00.0/nvidia.com/gpu,vendor=10de,device=2204: the
// device at ADDRESS must have those IDs (lspci -nn's [10de:2204]); host
// limits the alias to one host (its name, or a URI whose host part is
// taken); allow, once per kind, lets a storage, network or bridge class
// device through. An entry given as the flag's separate values (the flag
// splits at commas) is joined back: an option belongs to the alias before
// it. Aliases and addresses (on the same host) are unique; none (or no
// entry) allows no device.
func ParseHostDevices(entries []string) ([]HostDevice, error) {
	var devices []HostDevice
	var errs []error
	var cur *HostDevice // the entry options attach to; nil after a bad one
	bad := false        // the last alias did not parse: its options are dropped
	finish := func() {
		if cur == nil {
			return
		}
		d := *cur
		cur = nil
		if (d.IDs.Vendor == 0) != (d.IDs.Device == 0) {
			errs = append(errs, fmt.Errorf("%s: vendor= and device= go together", d.Alias))
			return
		}
		if i := slices.IndexFunc(devices, func(o HostDevice) bool {
			return o.Alias == d.Alias || o.Address == d.Address && (o.Host == "" || d.Host == "" || o.Host == d.Host)
		}); i >= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: the alias or the address is listed already (%s=%s)", d.Alias, d.Address, devices[i].Alias, devices[i].Address))
			return
		}
		devices = append(devices, d)
	}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" || e == None {
			continue
		}
		key, value, ok := strings.Cut(e, "=")
		if ok && slices.Contains(hostDeviceOptions, key) {
			switch {
			case bad:
			case cur == nil:
				errs = append(errs, fmt.Errorf("%q: an option follows its alias's address: %s", e, hostDeviceSyntax))
			default:
				if err := cur.setOption(key, value); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", cur.Alias, err))
				}
			}
			continue
		}
		finish()
		d, err := parseHostDevice(e)
		if bad = err != nil; bad {
			errs = append(errs, err)
			continue
		}
		cur = &d
	}
	finish()
	return devices, errors.Join(errs...)
}

// parseHostDevice reads ALIAS=ADDRESS[/RESOURCE].
func parseHostDevice(e string) (HostDevice, error) {
	alias, rest, ok := strings.Cut(e, "=")
	if !ok || len(validation.IsDNS1123Label(alias)) > 0 { // as spec.hostDevices[].name
		return HostDevice{}, fmt.Errorf("%q: want %s, ALIAS a DNS label", e, hostDeviceSyntax)
	}
	address, resource, _ := strings.Cut(rest, "/")
	addr, err := pci.ParseAddress(address)
	if err != nil {
		return HostDevice{}, fmt.Errorf("%s: %w", alias, err)
	}
	if resource != "" {
		if msgs := validation.IsQualifiedName(resource); len(msgs) > 0 || !strings.Contains(resource, "/") {
			return HostDevice{}, fmt.Errorf("%s: resource %q is not an extended resource name such as nvidia.com/gpu", alias, resource)
		}
	}
	return HostDevice{Alias: alias, Address: addr, Resource: corev1.ResourceName(resource)}, nil
}

// setOption applies one KEY=VALUE option of d's entry.
func (d *HostDevice) setOption(key, value string) error {
	switch key {
	case "vendor", "device":
		id, err := pci.ParseID(value)
		if err == nil && id == 0 {
			err = fmt.Errorf("%s 0 names no device", key)
		}
		if err != nil {
			return err
		}
		if key == "vendor" {
			d.IDs.Vendor = id
		} else {
			d.IDs.Device = id
		}
	case "host":
		host := value
		if strings.Contains(value, "://") {
			u, err := url.Parse(value)
			if err != nil || u.Hostname() == "" {
				return fmt.Errorf("host=%s: a URI must name its host (qemu+ssh://gpu1/system); name the manager's own host by its name", value)
			}
			host = u.Hostname()
		}
		if host == "" {
			return errors.New("host= needs the host's name")
		}
		d.Host = host
	case "allow":
		k := pci.Kind(value)
		if !slices.Contains(pci.Kinds, k) {
			return fmt.Errorf("allow=%s: want storage, network or bridge", value)
		}
		if !slices.Contains(d.Allow, k) {
			d.Allow = append(d.Allow, k)
		}
	}
	return nil
}

// HostDevice is the device the operator allowed under alias.
func (p Policy) HostDevice(alias string) (HostDevice, error) {
	if i := slices.IndexFunc(p.HostDevices, func(d HostDevice) bool { return d.Alias == alias }); i >= 0 {
		return p.HostDevices[i], nil
	}
	if len(p.HostDevices) == 0 {
		return HostDevice{}, errors.New("no host device may be passed through: the manager's --host-devices lists none")
	}
	aliases := make([]string, len(p.HostDevices))
	for i, d := range p.HostDevices {
		aliases[i] = d.Alias
	}
	return HostDevice{}, fmt.Errorf("must be one of the host devices %s (the manager's --host-devices)", strings.Join(aliases, ", "))
}
