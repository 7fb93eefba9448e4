// Package ipaddress claims a VM's addresses from Cluster API IPAM pools
// (the ipam.cluster.x-k8s.io contract): one IPAddressClaim per pool, owned
// by the VM's object (a LibvirtMachine, or the LibvirtCluster of an HAProxy
// VM) and named after it (naming.IPAddressClaimName,
// naming.LoadBalancerIPAddressClaimName: a moved object finds its claims),
// read back through the IPAddress the pool's provider made, and deleted
// with the VM once its domain is gone.
package ipaddress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// recheckClaim is how often a machine whose claim has no address yet looks
// again; the controller also wakes when a claim it owns changes.
const recheckClaim = time.Minute

// Host is what the service asks the VM's libvirt host: its domain, and
// who holds what on its segment.
type Host interface {
	virt.NetworkHost
	virt.DomainHost
}

// Service claims the addresses; its outcome is the condition of the
// step it runs in (AddressReserved for a machine, after the address
// step's; LoadBalancerReady for an HAProxy VM).
type Service struct {
	c      client.Client
	vm     *scope.VM
	host   Host
	others segment.Hosts
	policy tenancy.Policy
	// owner is the object the claims belong to, kind its kind.
	owner client.Object
	kind  string
	// cluster is the Cluster's name the claims carry.
	cluster string
	// claimName names the claim on the VM's i-th pool.
	claimName func(i int) string
	event     func(eventType, reason, message string)
	// domainDefined tells whether the VM's domain exists (the identity
	// step's answer); nil: it is looked for as if not.
	domainDefined func() bool
	// addresses are what the last Reconcile claimed, for the steps after
	// it.
	addresses []cloudinit.StaticAddress
}

var _ services.Service = (*Service)(nil)

// New returns the IPAM service of the machine of s, placed on host, under
// the operator's policy.
func New(s *scope.MachineScope, host Host, policy tenancy.Policy) *Service {
	lm := s.LibvirtMachine
	return &Service{c: s.Client, vm: s.VM, host: host, policy: policy, owner: lm, kind: "LibvirtMachine", cluster: s.ClusterName(),
		claimName: func(i int) string { return naming.IPAddressClaimName(lm.Name, i) }, event: s.Event}
}

// NewLoadBalancer returns the IPAM service of the HAProxy VM vm of the
// cluster of s, placed on host.
func NewLoadBalancer(s *scope.ClusterScope, vm *scope.VM, host Host, policy tenancy.Policy) *Service {
	lc := s.LibvirtCluster
	return &Service{c: s.Client, vm: vm, host: host, policy: policy, owner: lc, kind: "LibvirtCluster", cluster: s.ClusterName(),
		claimName: func(int) string { return naming.LoadBalancerIPAddressClaimName(lc.Name) }, event: s.Event}
}

// WithOtherHosts has the addresses checked against the domains of the
// other libvirt hosts the manager reaches too.
func (svc *Service) WithOtherHosts(others segment.Hosts) *Service {
	svc.others = others
	return svc
}

// WithDomainDefined has the claims kept as the VM's domain holds them once
// defined says it exists.
func (svc *Service) WithDomainDefined(defined func() bool) *Service {
	svc.domainDefined = defined
	return svc
}

func (*Service) Name() string { return "IP address claims" }

// Addresses are the addresses the last Reconcile read from the pools'
// IPAddresses, which the seed gives the guest and the domain pins its
// traffic filter to; nil when the VM takes DHCP or a claim waits.
func (svc *Service) Addresses() []cloudinit.StaticAddress { return svc.addresses }

// Reconcile claims an address from every pool and hands them to the seed
// and domain steps of the same reconcile; a VM without pools takes DHCP
// and is left alone. Before the VM's domain exists, an address anyone
// else holds on the segment is refused (segment.CheckAddresses). Once it
// exists, the claims are kept (a deleted one is made again, so that the
// pool does not hand the guest's address to another VM) and an address
// that differs from the one the domain was defined with is refused: the
// guest keeps what it holds.
func (svc *Service) Reconcile(ctx context.Context) (services.Result, error) {
	vm := svc.vm
	svc.addresses = nil
	if vm.Addressing != scope.AddressingPool {
		return services.Result{}, nil
	}
	if ns, ok := naming.NameNamespace(vm.Network.Name); vm.Network.Name != "" && ok {
		return services.Result{}, services.Fail(infrav1.UnsupportedNetworkReason, services.Requeue(0, "pools on a cluster network"),
			"network.addressesFromPools needs a host bridge or an existing libvirt network: network %s is the one the provider made for a cluster of namespace %s, whose DHCP server reserves the machines' addresses", vm.Network.Name, ns)
	}
	held, defined, err := svc.held(ctx)
	if err != nil {
		return services.Result{}, err
	}
	addresses := make([]cloudinit.StaticAddress, 0, len(vm.AddressPools))
	described := make([]string, 0, len(vm.AddressPools))
	for i, pool := range vm.AddressPools {
		claim, err := svc.ensureClaim(ctx, i, pool)
		if err != nil {
			return services.Result{}, err
		}
		a, err := svc.address(ctx, claim)
		switch {
		case defined && vm.Provisioned && isWaiting(err):
			// The guest runs with its address; the pool answers later.
			described = append(described, fmt.Sprintf("the guest holds %s (IPAddressClaim %s waits for %s %s)", joinAddrs(held), claim.Name, pool.Kind, pool.Name))
			continue
		case err != nil:
			return services.Result{}, err
		case defined && len(held) > 0 && !slices.Contains(held, a.Prefix.Addr()):
			return services.Result{}, services.Fail(infrav1.IPAddressChangedReason, services.Requeue(recheckClaim, "address changed"),
				"IPAddressClaim %s got %s from %s %s, but domain %s was defined with %s, which its guest holds: the claim was deleted and made again; the guest keeps its address, and the pool must give the claim that one back",
				claim.Name, a.Prefix.Addr(), pool.Kind, pool.Name, vm.Domain, joinAddrs(held))
		}
		addresses = append(addresses, a)
		described = append(described, fmt.Sprintf("%s from %s %s", a.Prefix, pool.Kind, pool.Name))
	}
	if !defined {
		ips := make([]netip.Addr, len(addresses))
		for i, a := range addresses {
			ips[i] = a.Prefix.Addr()
		}
		if err := segment.New(vm, svc.host, svc.others).CheckAddresses(ctx, ips); err != nil {
			return services.Result{}, err
		}
	}
	if len(addresses) == len(vm.AddressPools) {
		svc.addresses = addresses
	}
	return services.Done(infrav1.ReadyReason, strings.Join(described, ", ")), nil
}

// held are the static addresses the VM's domain was defined with, as
// libvirt records them, and whether the domain exists (as this VM's).
func (svc *Service) held(ctx context.Context) ([]netip.Addr, bool, error) {
	vm := svc.vm
	if svc.domainDefined == nil || !svc.domainDefined() {
		return nil, false, nil
	}
	info, err := svc.host.DomainInfo(ctx, vm.Domain)
	switch {
	case virt.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, services.Fail(infrav1.LibvirtErrorReason, err, "Looking up domain %s: %v", vm.Domain, err)
	case !info.Owner.IsObject(vm.Owner):
		return nil, false, nil // not this VM's: the domain step says so
	}
	return info.StaticAddresses, true, nil
}

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// isWaiting tells whether err is a claim's wait for its IPAddress.
func isWaiting(err error) bool {
	var ce *services.ConditionError
	return errors.As(err, &ce) && ce.Reason == infrav1.WaitingForIPAddressReason
}

// ensureClaim returns the machine's claim on the i-th pool, creating it
// when missing. A claim of that name that another object owns, or that
// claims from another pool, is refused: it is not this machine's.
func (svc *Service) ensureClaim(ctx context.Context, i int, pool infrav1.IPPoolReference) (*ipamv1.IPAddressClaim, error) {
	key := types.NamespacedName{Namespace: svc.owner.GetNamespace(), Name: svc.claimName(i)}
	claim := &ipamv1.IPAddressClaim{}
	err := svc.c.Get(ctx, key, claim)
	switch {
	case apierrors.IsNotFound(err):
		claim = svc.newClaim(key, pool)
		if err := svc.c.Create(ctx, claim); err != nil {
			return nil, fmt.Errorf("creating IPAddressClaim %s: %w", key.Name, err)
		}
		svc.event(corev1.EventTypeNormal, "IPAddressClaimed", fmt.Sprintf("Claimed an address from %s %s (IPAddressClaim %s)", pool.Kind, pool.Name, key.Name))
	case err != nil:
		return nil, fmt.Errorf("reading IPAddressClaim %s: %w", key.Name, err)
	}
	if !svc.owns(claim) || claim.Spec.PoolRef != poolRef(pool) {
		return nil, services.Fail(infrav1.IPAddressInvalidReason, services.Requeue(0, "claim not ours"),
			"IPAddressClaim %s exists but is not %s %s's claim on %s %s: delete it", key.Name, svc.kind, svc.owner.GetName(), pool.Kind, pool.Name)
	}
	return claim, nil
}

// newClaim is the VM's claim on pool, owned (controller) by its object,
// so that the claim goes with it even if the provider never deletes it,
// and labelled like the object for the watch filter.
func (svc *Service) newClaim(key types.NamespacedName, pool infrav1.IPPoolReference) *ipamv1.IPAddressClaim {
	labels := map[string]string{clusterv1.ClusterNameLabel: svc.cluster}
	if v, ok := svc.owner.GetLabels()[clusterv1.WatchLabel]; ok {
		labels[clusterv1.WatchLabel] = v
	}
	return &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: infrav1.GroupVersion.String(), Kind: svc.kind, Name: svc.owner.GetName(), UID: svc.owner.GetUID(),
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}}},
		Spec: ipamv1.IPAddressClaimSpec{ClusterName: svc.cluster, PoolRef: poolRef(pool)},
	}
}

// address reads the IPAddress the pool made for claim and checks that it
// is claim's and an address the guest may hold.
func (svc *Service) address(ctx context.Context, claim *ipamv1.IPAddressClaim) (cloudinit.StaticAddress, error) {
	pool := claim.Spec.PoolRef
	waiting := func() error {
		return services.Fail(infrav1.WaitingForIPAddressReason, services.Requeue(recheckClaim, "no IPAddress yet"),
			"Waiting for %s %s to give IPAddressClaim %s an address", pool.Kind, pool.Name, claim.Name)
	}
	if claim.Status.AddressRef.Name == "" {
		return cloudinit.StaticAddress{}, waiting()
	}
	ip := &ipamv1.IPAddress{}
	err := svc.c.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Status.AddressRef.Name}, ip)
	switch {
	case apierrors.IsNotFound(err):
		return cloudinit.StaticAddress{}, waiting()
	case err != nil:
		return cloudinit.StaticAddress{}, fmt.Errorf("reading IPAddress %s: %w", claim.Status.AddressRef.Name, err)
	}
	a, err := staticAddress(ip, claim)
	if err == nil {
		err = svc.policy.CheckPoolAddress(a.Prefix.Addr())
	}
	if err != nil {
		return cloudinit.StaticAddress{}, services.Fail(infrav1.IPAddressInvalidReason, services.Requeue(recheckClaim, "unusable IPAddress"),
			"IPAddress %s of IPAddressClaim %s: %v", ip.Name, claim.Name, err)
	}
	return a, nil
}

// staticAddress is ip as the guest's static address, when ip was made for
// claim from its pool and holds an address, prefix and gateway that go
// together.
func staticAddress(ip *ipamv1.IPAddress, claim *ipamv1.IPAddressClaim) (cloudinit.StaticAddress, error) {
	if ip.Spec.ClaimRef.Name != claim.Name || ip.Spec.PoolRef != claim.Spec.PoolRef {
		return cloudinit.StaticAddress{}, fmt.Errorf("made for claim %s of %s %s, not for this claim", ip.Spec.ClaimRef.Name, ip.Spec.PoolRef.Kind, ip.Spec.PoolRef.Name)
	}
	addr, err := netip.ParseAddr(ip.Spec.Address)
	if err != nil || addr.Zone() != "" {
		return cloudinit.StaticAddress{}, fmt.Errorf("address %q is not an IP address", ip.Spec.Address)
	}
	bits := int(ptr.Deref(ip.Spec.Prefix, -1))
	if bits < 0 || bits > addr.BitLen() {
		return cloudinit.StaticAddress{}, fmt.Errorf("prefix %d does not fit address %s", bits, addr)
	}
	a := cloudinit.StaticAddress{Prefix: netip.PrefixFrom(addr, bits)}
	if ip.Spec.Gateway != "" {
		if a.Gateway, err = netip.ParseAddr(ip.Spec.Gateway); err != nil {
			return cloudinit.StaticAddress{}, fmt.Errorf("gateway %q is not an IP address", ip.Spec.Gateway)
		}
	}
	return a, cloudinit.CheckStaticAddress(a)
}

// Delete deletes the VM's claims, which returns their addresses to the
// pools; it runs after the domain's deletion, so that no address is
// handed out again while a guest still holds it.
func (svc *Service) Delete(ctx context.Context) error {
	var errs []error
	for i := range svc.vm.AddressPools {
		claim := &ipamv1.IPAddressClaim{}
		err := svc.c.Get(ctx, types.NamespacedName{Namespace: svc.owner.GetNamespace(), Name: svc.claimName(i)}, claim)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		}
		if !svc.owns(claim) {
			continue
		}
		if err := svc.c.Delete(ctx, claim); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting IPAddressClaim %s: %w", claim.Name, err))
		}
	}
	return errors.Join(errs...)
}

// owns tells whether the VM's object owns claim: by kind and name, not
// UID, which clusterctl move and restores change.
func (svc *Service) owns(claim *ipamv1.IPAddressClaim) bool {
	for _, o := range claim.OwnerReferences {
		if o.Kind == svc.kind && o.Name == svc.owner.GetName() && strings.HasPrefix(o.APIVersion, infrav1.GroupVersion.Group+"/") {
			return true
		}
	}
	return false
}

// poolRef is pool in IPAM's own terms.
func poolRef(pool infrav1.IPPoolReference) ipamv1.IPPoolReference {
	return ipamv1.IPPoolReference{APIGroup: pool.APIGroup, Kind: pool.Kind, Name: pool.Name}
}
