// Package vmplan builds the plan of one VM, a LibvirtMachine's or a
// LibvirtCluster's HAProxy VM: the machine services in the order they
// create things, each step's result handed to the steps that use it, and
// the rule that a provisioned VM skips the steps that only build it. The
// kinds of VM add their own steps at the places where their inputs exist
// (Extra); the order of every step and what it hands on are here.
package vmplan

import (
	"context"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/address"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/datadisk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/hostdevice"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/identity"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/ipaddress"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Spec is what differs between the VMs a plan is built for.
type Spec struct {
	VM   *scope.VM
	Host virt.Host
	// Owner is the object reported provisioned once the VM runs.
	Owner services.Provisioner
	// Conditions are where the steps report.
	Conditions Conditions
	// Claims claims the VM's addresses from its IPAM pools
	// (ipaddress.New, ipaddress.NewLoadBalancer).
	Claims *ipaddress.Service
	// Seed writes the VM's seed with its user-data (seed.New,
	// seed.NewWithUserData).
	Seed *seed.Service
	// NetworkConfig is the seed's network-config, made from the addresses
	// the claims got (none: the VM takes DHCP); nil for the VM's own
	// (scope.VM.StaticNetworkConfig).
	NetworkConfig func(static []cloudinit.StaticAddress) ([]byte, error)
	// Images imports base images given by URL.
	Images disk.Importer
	// Policy is the operator's: host devices, the traffic filter.
	Policy tenancy.Policy
	// MaxDiskBytes bounds the root disk (0: no bound).
	MaxDiskBytes uint64
	// OtherHosts are the other libvirt hosts whose domains the VM's MAC and
	// pool addresses must not collide with.
	OtherHosts segment.Hosts
	// Domain are the domain step's options; its TrafficFilter is taken
	// from Policy.
	Domain domain.Options
}

// Conditions name the condition each kind of step reports on.
type Conditions struct {
	// Address is the reservation's and the claims'; Disk the root and
	// data disks'; Seed the seed's; Domain the identity's, host devices'
	// and domain's.
	Address, Disk, Seed, Domain string
	// PartOf, when set, names the whole the VM is one part of (see
	// services.Step.PartOf): every step then reports only its failures.
	PartOf string
}

// Extra are the steps a kind of VM adds, at the places where what they
// need exists.
type Extra struct {
	// Checks run first, before anything exists, and not once the VM is
	// provisioned.
	Checks []services.Step
	// Addressed run once the VM's address is reserved or claimed, before
	// its disks (the HAProxy VM's endpoint).
	Addressed []services.Step
	// Running run once the domain runs, before the VM is reported
	// provisioned (the guest's addresses).
	Running []services.Step
	// Provisioned run after it is reported provisioned, on every
	// reconcile (the bootstrap check, HAProxy's configuration).
	Provisioned []services.Step
}

// Plan is one VM's services, wired together: each holds what it made in
// the last reconcile, which the steps after it read through the method
// values New hands them.
type Plan struct {
	spec        Spec
	Identity    *identity.Service
	HostDevices *hostdevice.Service
	Address     *address.Service
	Claims      *ipaddress.Service
	Disk        *disk.Service
	DataDisks   *datadisk.Service
	Seed        *seed.Service
	Domain      *domain.Service
}

// New builds the VM's services and wires each step's result to the steps
// that use it.
func New(spec Spec) *Plan {
	vm, host := spec.VM, spec.Host
	p := &Plan{spec: spec, Identity: identity.New(vm, host)}
	p.HostDevices = hostdevice.New(vm, host, spec.Policy)
	p.Address = address.New(vm, host).WithOtherHosts(spec.OtherHosts)
	p.Claims = spec.Claims.WithOtherHosts(spec.OtherHosts).WithDomainDefined(p.Identity.DomainDefined)
	p.Disk = disk.New(vm, host, spec.Images).WithMaxBytes(spec.MaxDiskBytes)
	p.DataDisks = datadisk.New(vm, host)
	networkConfig := spec.NetworkConfig
	if networkConfig == nil {
		networkConfig = vm.StaticNetworkConfig
	}
	p.Seed = spec.Seed.WithDomainDefined(p.Identity.DomainDefined).
		WithNetworkConfig(func() ([]byte, error) { return networkConfig(p.Claims.Addresses()) })
	opts := spec.Domain
	opts.TrafficFilter = spec.Policy.TrafficFilter
	p.Domain = domain.New(vm, host, domain.Parts{
		RootDisk: p.Disk.Volume, Seed: p.Seed.Volume, DataDisks: p.DataDisks.Volumes,
		HostDevices: p.HostDevices.Devices, StaticAddresses: p.Claims.Addresses, Found: p.Identity.Domain,
	}, opts)
	return p
}

// Steps is the VM's plan with extra's steps in their places. The checks,
// host devices, address reservation, disks and seed only build the VM:
// once it is provisioned they are skipped (Run), since ensuring them
// again would cost libvirt calls on every reconcile and could recreate a
// vanished root disk as a blank one. The claims are not: they are kept
// while the domain exists.
func (p *Plan) Steps(extra Extra) services.Plan {
	c := p.spec.Conditions
	step := func(svc services.Service, condition string, buildOnly bool) services.Step {
		return services.Step{Service: svc, Condition: condition, PartOf: c.PartOf, SkipOnceProvisioned: buildOnly}
	}
	var steps services.Plan
	for _, st := range extra.Checks {
		st.SkipOnceProvisioned = true
		steps = append(steps, st)
	}
	steps = append(steps,
		step(p.Identity, c.Domain, false),
		step(p.HostDevices, c.Domain, true),
		step(p.Address, c.Address, true),
		step(p.Claims, c.Address, false),
	)
	steps = append(steps, extra.Addressed...)
	steps = append(steps,
		step(p.Disk, c.Disk, true),
		step(p.DataDisks, c.Disk, true),
		step(p.Seed, c.Seed, true),
		step(p.Domain, c.Domain, false),
	)
	steps = append(steps, extra.Running...)
	steps = append(steps, services.Step{Service: services.MarkProvisioned(p.spec.Owner)})
	return append(steps, extra.Provisioned...)
}

// Settled tells whether the VM's build steps are skipped: its object is
// provisioned and, for a disposable VM, the identity step of this
// reconcile found its domain (a vanished one is made again, volumes
// first).
func (p *Plan) Settled() bool {
	return p.spec.Owner.IsProvisioned() && (!p.spec.VM.Disposable || p.Identity.Found())
}

// Run runs steps (Steps' plan) forward, reporting on r.
func (p *Plan) Run(ctx context.Context, r services.Reporter, steps services.Plan) error {
	return steps.RunSettled(ctx, r, p.Settled)
}

// VM is the VM the plan builds.
func (p *Plan) VM() *scope.VM { return p.spec.VM }

// DomainDefined tells whether the VM's domain exists in libvirt, as the
// identity step of the last Run found it.
func (p *Plan) DomainDefined() bool { return p.Identity.DomainDefined() }
