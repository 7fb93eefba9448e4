package tenancy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
)

// HostDevice is a PCI device of the libvirt hosts that the operator lets
// a machine take whole (the manager's --host-devices). Tenants name it by
// its alias: a raw address would let a namespace take any device of the
// host, its disk controller or its NIC included.
type HostDevice struct {
	// Alias is the name machines give in spec.hostDevices.
	Alias string
	// Address is the device on every host that has it.
	Address pci.Address
	// Resource is the extended resource the device gives a Node (for
	// example nvidia.com/gpu), which a LibvirtMachineTemplate reports in
	// its capacity for the cluster autoscaler; empty for none.
	Resource corev1.ResourceName
}

// ParseHostDevices reads the manager's --host-devices entries:
// ALIAS=ADDRESS or ALIAS=ADDRESS/RESOURCE, as gpu0=0000:65:00.0/nvidia.com/gpu.
// Aliases and addresses are unique; none (or no entry) allows no device.
func ParseHostDevices(entries []string) ([]HostDevice, error) {
	var devices []HostDevice
	var errs []error
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" || e == None {
			continue
		}
		alias, rest, ok := strings.Cut(e, "=")
		if !ok || len(validation.IsDNS1123Label(alias)) > 0 { // as spec.hostDevices[].name
			errs = append(errs, fmt.Errorf("%q: want ALIAS=ADDRESS[/RESOURCE], ALIAS a DNS label (gpu0=0000:65:00.0/nvidia.com/gpu)", e))
			continue
		}
		address, resource, _ := strings.Cut(rest, "/")
		addr, err := pci.ParseAddress(address)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", alias, err))
			continue
		}
		if resource != "" {
			if msgs := validation.IsQualifiedName(resource); len(msgs) > 0 || !strings.Contains(resource, "/") {
				errs = append(errs, fmt.Errorf("%s: resource %q is not an extended resource name such as nvidia.com/gpu", alias, resource))
				continue
			}
		}
		if i := slices.IndexFunc(devices, func(d HostDevice) bool { return d.Alias == alias || d.Address == addr }); i >= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: the alias or the address is listed already (%s=%s)", alias, addr, devices[i].Alias, devices[i].Address))
			continue
		}
		devices = append(devices, HostDevice{Alias: alias, Address: addr, Resource: corev1.ResourceName(resource)})
	}
	return devices, errors.Join(errs...)
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
