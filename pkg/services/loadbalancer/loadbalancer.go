// Package loadbalancer serves a cluster's control-plane endpoint: an
// HAProxy VM built by the machine services (address, disk, seed, domain)
// on the cluster's scope.VM, whose reserved address is the endpoint (on
// a host bridge it holds the user's endpoint as a static address; with
// loadBalancer.addressFromPool the pool's address, and nothing else) and
// whose configuration follows the cluster's control-plane machines. The
// configuration is written, checked and reloaded through the guest agent,
// only when it changes. With load balancer type None the user's endpoint
// is checked for presence only.
package loadbalancer

import (
	"context"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/address"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/identity"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/ipaddress"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Waits of the load balancer. The guest agent's connect event and the
// domain's lifecycle events normally come first; these cover lost events.
const (
	recheckAgent   = 15 * time.Second
	recheckServing = 5 * time.Second
	dialTimeout    = 3 * time.Second
	// shutdownTimeout is short: the VM holds no state, and it is only
	// deleted once no machine of the cluster remains.
	shutdownTimeout = time.Second
	// servingBound is how long HAProxy may take to serve before
	// LoadBalancerReady says it does not (LoadBalancerNotServing) rather
	// than that it is on its way: a TCG VM on a busy host boots in minutes.
	servingBound = 15 * time.Minute
)

// userData is the HAProxy VM's cloud-config. It configures nothing: the
// controller writes haproxy.cfg through the guest agent once the VM runs,
// so the seed holds no secret and never changes.
const userData = `#cloud-config
# HAProxy VM of a cluster-api-provider-libvirt cluster. The provider writes
# /etc/haproxy/haproxy.cfg through the guest agent.
`

// Service serves the endpoint. It reports LoadBalancerReady itself, step
// by step, through its own plan.
type Service struct {
	scope  *scope.ClusterScope
	images disk.Importer
	// vm and address are the HAProxy VM and its address step, which plan
	// builds for the Reconcile or Delete it runs in.
	vm      *scope.VM
	address *address.Service
	// policy is the operator's: its traffic filter guards the HAProxy
	// VM's NIC on a shared segment, its ranges bound a pool's address.
	policy tenancy.Policy
	// maxDiskBytes bounds the VM's root disk, which takes the image's size.
	maxDiskBytes uint64
	// others are the other libvirt hosts whose domains the VM's MAC and
	// pool address must not collide with.
	others segment.Hosts
}

var _ services.Service = (*Service)(nil)

// New returns the load balancer service of s under the operator's policy;
// images imports the VM's image when spec.loadBalancer.image names a URL.
func New(s *scope.ClusterScope, images disk.Importer, policy tenancy.Policy) *Service {
	return &Service{scope: s, images: images, policy: policy}
}

// WithMaxDiskBytes bounds the HAProxy VM's root disk at n bytes (the
// operator's --max-machine-disk): it takes its image's size, and the
// image is the tenant's choice.
func (svc *Service) WithMaxDiskBytes(n uint64) *Service {
	svc.maxDiskBytes = n
	return svc
}

// WithOtherHosts has the HAProxy VM's MAC and pool address checked
// against the domains of the other libvirt hosts the manager reaches too.
func (svc *Service) WithOtherHosts(others segment.Hosts) *Service {
	svc.others = others
	return svc
}

func (*Service) Name() string { return "load balancer" }

// plan is the load balancer's steps, every one reported on
// LoadBalancerReady: with HAProxy, the machine services building the VM
// (their failures name it, their successes say nothing: the condition
// turns True only once HAProxy serves), the endpoint (the VM's reserved
// address) published between them, then the configuration; with type
// None, the user's endpoint. The VM's address, disk and seed are
// SkipOnceProvisioned: once the VM ran (provisioned) they are settled, and
// ensuring them on every reconcile would only cost libvirt calls. The VM
// is built from the LibvirtCluster as it stands, after the cluster's
// network step.
func (svc *Service) plan(haproxy bool) services.Plan {
	const ready = infrav1.LoadBalancerReadyCondition
	if !haproxy {
		return services.Plan{
			{Service: userEndpoint{svc}, Condition: ready},
			{Service: provisioned{svc}, Condition: ready},
		}
	}
	host := svc.scope.Host
	svc.vm = svc.scope.LoadBalancerVM()
	svc.address = address.New(svc.vm, host).WithOtherHosts(svc.others)
	vm := "HAProxy VM " + svc.vm.Domain
	return services.Plan{
		{Service: identity.New(svc.vm, host), Condition: ready, PartOf: vm},
		{Service: svc.address, Condition: ready, PartOf: vm, SkipOnceProvisioned: true},
		// Not SkipOnceProvisioned: the claim is kept while the VM exists.
		{Service: ipaddress.NewLoadBalancer(svc.scope, svc.vm, host, svc.policy).WithOtherHosts(svc.others), Condition: ready, PartOf: vm},
		{Service: endpoint{svc}, Condition: ready, SkipOnceProvisioned: true},
		{Service: disk.New(svc.vm, host, svc.images).WithMaxBytes(svc.maxDiskBytes), Condition: ready, PartOf: vm, SkipOnceProvisioned: true},
		{Service: seed.NewWithUserData(svc.vm, host, []byte(userData)).WithNetworkConfig(svc.networkConfig), Condition: ready, PartOf: vm, SkipOnceProvisioned: true},
		{Service: domain.New(svc.vm, host, domain.Options{ShutdownTimeout: shutdownTimeout, TrafficFilter: svc.policy.TrafficFilter}), Condition: ready, PartOf: vm},
		{Service: provisioned{svc}, Condition: ready},
		{Service: configSync{svc}, Condition: ready},
	}
}

// Reconcile serves the endpoint. The cluster is provisioned once the
// HAProxy VM runs (type HAProxy) or the endpoint is set (type None);
// LoadBalancerReady turns True when the endpoint accepts connections.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	plan := svc.plan(svc.scope.LoadBalancerEnabled())
	if svc.scope.IsProvisioned() {
		// The address, disk and seed are ensured again when the domain has
		// to be defined anew (domain.ErrVolumesUnknown) or one of them is
		// missing.
		if err := plan.Run(ctx, svc.scope, true); err == nil || !virt.IsNotFound(err) {
			return services.Result{}, err
		}
	}
	return services.Result{}, plan.Run(ctx, svc.scope, false)
}

// Delete removes the HAProxy VM in reverse order of creation: domain,
// seed, root disk, address reservation. Each treats not-found as success.
// It deletes the VM whatever the type: a VM made before the type changed
// is deleted with the cluster.
func (svc *Service) Delete(ctx context.Context) error {
	plan := svc.plan(true)
	if svc.vm.MAC == "" && svc.scope.LibvirtCluster.Status.LoadBalancer == nil {
		// Nothing was ever created: the MAC is persisted before anything is.
		return nil
	}
	if err := plan.Delete(ctx, svc.scope); err != nil {
		return err
	}
	svc.scope.LoadBalancerDeleted()
	return nil
}

// provisioned reports the infrastructure provisioned once the HAProxy VM
// runs: its address is the published endpoint, and the control plane's
// first machine, which needs it only minutes into its own boot, then boots
// alongside it rather than after it. With type None, once the user's
// endpoint is set.
type provisioned struct{ lb *Service }

func (provisioned) Name() string { return "provisioned" }

// Reconcile reports the infrastructure provisioned.
func (p provisioned) Reconcile(context.Context) (services.Result, error) {
	p.lb.scope.SetProvisioned()
	return services.Result{}, nil
}

// Delete does nothing: being provisioned is never reset.
func (provisioned) Delete(context.Context) error { return nil }
