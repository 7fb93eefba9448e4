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
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/ipaddress"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/vmplan"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
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

// vmPlan is the HAProxy VM's plan (vmplan, which the machines share),
// built from the LibvirtCluster as it stands, after the cluster's network
// step. Every step reports on LoadBalancerReady: the VM's own report only
// their failures, naming the VM (the condition turns True only once
// HAProxy serves). The load balancer adds the endpoint, published once
// the VM's address is known and before the VM first boots, and HAProxy's
// configuration once it runs.
func (svc *Service) vmPlan() (*vmplan.Plan, services.Plan) {
	const ready = infrav1.LoadBalancerReadyCondition
	host := svc.scope.Host
	vm := svc.scope.LoadBalancerVM()
	p := vmplan.New(vmplan.Spec{
		VM: vm, Host: host, Owner: svc.scope,
		Conditions: vmplan.Conditions{Address: ready, Disk: ready, Seed: ready, Domain: ready, PartOf: "HAProxy VM " + vm.Domain},
		Claims:     ipaddress.NewLoadBalancer(svc.scope, vm, host, svc.policy),
		Seed:       seed.NewWithUserData(vm, host, []byte(userData)),
		NetworkConfig: func(static []cloudinit.StaticAddress) ([]byte, error) {
			return networkConfig(svc.scope.LibvirtCluster, vm, static)
		},
		Images: svc.images, Policy: svc.policy, MaxDiskBytes: svc.maxDiskBytes, OtherHosts: svc.others,
		Domain: domain.Options{ShutdownTimeout: shutdownTimeout},
	})
	ep := endpoint{scope: svc.scope, vm: vm, policy: svc.policy, reserved: p.Address.Reserved, claimed: p.Claims.Addresses}
	return p, p.Steps(vmplan.Extra{
		Addressed:   []services.Step{{Service: ep, Condition: ready, SkipOnceProvisioned: true}},
		Provisioned: []services.Step{{Service: configSync{svc: svc, vm: vm}, Condition: ready}},
	})
}

// Reconcile serves the endpoint. The cluster is provisioned once the
// HAProxy VM runs (type HAProxy) or the endpoint is set (type None);
// LoadBalancerReady turns True when the endpoint accepts connections.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	if !svc.scope.LoadBalancerEnabled() {
		const ready = infrav1.LoadBalancerReadyCondition
		return services.Result{}, services.Plan{
			{Service: userEndpoint{svc}, Condition: ready},
			{Service: services.MarkProvisioned(svc.scope), Condition: ready},
		}.Run(ctx, svc.scope, false)
	}
	vm, steps := svc.vmPlan()
	return services.Result{}, vm.Run(ctx, svc.scope, steps)
}

// Delete removes the HAProxy VM in reverse order of creation: domain,
// seed, root disk, address reservation. Each treats not-found as success.
// It deletes the VM whatever the type: a VM made before the type changed
// is deleted with the cluster.
func (svc *Service) Delete(ctx context.Context) error {
	vm, steps := svc.vmPlan()
	if vm.VM().MAC == "" && svc.scope.LibvirtCluster.Status.LoadBalancer == nil {
		// Nothing was ever created: the MAC is persisted before anything is.
		return nil
	}
	if err := steps.Delete(ctx, svc.scope); err != nil {
		return err
	}
	svc.scope.LoadBalancerDeleted()
	return nil
}
